package bulkhead

import (
	"fmt"
	"sync"
)

// DefaultMaxKeys is the number of compartments a Group keeps before it
// drops its idle ones.
const DefaultMaxKeys = 1000

// Group holds one Bulkhead per key (a host, a method), created on demand
// with the same Config. It stays bounded without tracking use: past its
// maximum, a new key first drops every idle compartment (nothing in flight
// or queued), and the ones left are busy, so their number is bounded by the
// calls in flight. A call that fetched a compartment just as it was dropped
// uses it once more: for that instant its key has two.
//
// A Group is safe for concurrent use; Get on an existing key allocates
// nothing.
type Group struct {
	cfg     Config
	maxKeys int

	mu sync.RWMutex
	m  map[string]*Bulkhead
}

// NewGroup returns a Group whose compartments are configured by cfg, or
// the error New would give for cfg. maxKeys bounds the compartments kept
// before idle ones are dropped; zero means DefaultMaxKeys, and a negative
// value is invalid.
func NewGroup(cfg Config, maxKeys int) (*Group, error) {
	if _, err := New(cfg); err != nil {
		return nil, err
	}
	switch {
	case maxKeys == 0:
		maxKeys = DefaultMaxKeys
	case maxKeys < 0:
		return nil, fmt.Errorf("%w: NewGroup's maxKeys is %d; want 0 (the default, %d) or more", ErrInvalidConfig, maxKeys, DefaultMaxKeys)
	}
	return &Group{cfg: cfg, maxKeys: maxKeys, m: make(map[string]*Bulkhead)}, nil
}

// Get returns key's compartment, creating it if needed.
func (g *Group) Get(key string) *Bulkhead {
	g.mu.RLock()
	b := g.m[key]
	g.mu.RUnlock()
	if b != nil {
		return b
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if b = g.m[key]; b != nil {
		return b
	}
	if len(g.m) >= g.maxKeys {
		for k, b := range g.m {
			if b.InFlight() == 0 && b.Waiting() == 0 {
				delete(g.m, k)
			}
		}
	}
	b, _ = New(g.cfg) // NewGroup checked cfg
	g.m[key] = b
	return b
}
