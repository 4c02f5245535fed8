package guardgrpc

import (
	"sync"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
)

// bulkheads holds one bulkhead per key, created on demand. Past maxKeys, a
// new key first drops every idle bulkhead (nothing in flight or queued), so
// their number stays bounded by the calls in flight.
//
// It is safe for concurrent use; get on an existing key allocates nothing.
type bulkheads struct {
	cfg     bulkhead.Config
	maxKeys int

	mu sync.RWMutex
	m  map[string]*bulkhead.Bulkhead
}

func newBulkheads(cfg bulkhead.Config) *bulkheads {
	return &bulkheads{cfg: cfg, maxKeys: breaker.DefaultMaxKeys, m: make(map[string]*bulkhead.Bulkhead)}
}

func (g *bulkheads) get(key string) *bulkhead.Bulkhead {
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
	b, _ = bulkhead.New(g.cfg) // validated by NewClient
	g.m[key] = b
	return b
}
