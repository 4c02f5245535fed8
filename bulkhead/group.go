package bulkhead

import (
	"errors"
	"strconv"
	"sync"
)

// defaultMaxKeys is the number of compartments a Group keeps before it
// drops its idle ones, when GroupConfig.MaxKeys is zero.
const defaultMaxKeys = 1000

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

// GroupConfig configures a Group, as breaker.GroupConfig does a group of
// breakers. Its zero value is valid: unbounded compartments, at most 1000
// of them kept. It is a plain value that NewGroup copies.
type GroupConfig struct {
	// Config is the configuration of every compartment in the group.
	// NewGroup validates it as New does.
	Config Config
	// MaxKeys bounds the compartments kept before idle ones are dropped.
	// Zero means 1000; a negative value is invalid.
	MaxKeys int
}

// NewGroup returns a Group configured by cfg, or an error wrapping
// ErrInvalidConfig that names every invalid field.
func NewGroup(cfg GroupConfig) (*Group, error) {
	errs := cfg.Config.validate("GroupConfig.Config.")
	maxKeys := cfg.MaxKeys
	switch {
	case maxKeys == 0:
		maxKeys = defaultMaxKeys
	case maxKeys < 0:
		errs = append(errs, &configError{"GroupConfig.MaxKeys", maxKeys, "0 (the default, " + strconv.Itoa(defaultMaxKeys) + ") or more"})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &Group{cfg: cfg.Config, maxKeys: maxKeys, m: make(map[string]*Bulkhead)}, nil
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
