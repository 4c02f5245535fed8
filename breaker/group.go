package breaker

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of GroupConfig.
const (
	DefaultMaxKeys = 1000
	DefaultIdleTTL = 10 * time.Minute
)

// GroupConfig configures a Group. The zero GroupConfig is valid: default
// breakers, at most DefaultMaxKeys of them, idle ones dropped after
// DefaultIdleTTL. NewGroup copies it; ConfigFor is called concurrently.
type GroupConfig struct {
	// Config is the configuration of every breaker in the group, with Name
	// set to the key. Its OnTransition sees the key as Transition.Name, and
	// its Observer the key as event.Event.Dependency. NewGroup validates it
	// as New does.
	Config Config
	// ConfigFor, if set, returns the configuration for a new key instead of
	// Config (Name is still set to the key). It is called without any lock
	// held, possibly more than once for a key when goroutines race to create
	// it. It must return a Config that New accepts: Get panics with New's
	// error otherwise, since it can neither leave the key unguarded nor
	// guard it with thresholds nobody asked for.
	ConfigFor func(key string) Config
	// MaxKeys bounds the number of breakers held. When a new key would go
	// past it, one that has not been used recently is dropped (preferring
	// one that is not open). Zero means DefaultMaxKeys (1000); a negative
	// value is invalid.
	MaxKeys int
	// IdleTTL drops breakers not used for at least IdleTTL, except one
	// still open. The check runs lazily, when a new key is created at least
	// IdleTTL after the previous check, and drops the breakers unused since
	// that check. Zero means DefaultIdleTTL (10 min); negative means no
	// limit: never drop for idleness (MaxKeys still bounds the group).
	IdleTTL time.Duration
}

// Group holds one breaker per key (a host, an endpoint, a shard, a region:
// one per independent failure domain), created on demand and bounded in
// number, so a high-cardinality key cannot grow memory without limit.
//
// A dropped breaker is simply forgotten: its key gets a fresh closed breaker
// on next use, and holders of the old *Breaker keep a working, detached
// breaker.
//
// Group is safe for concurrent use by multiple goroutines. Get on an
// existing key takes a read lock and allocates nothing.
type Group struct {
	cfg     normalized
	cfgFor  func(string) Config
	maxKeys int
	ttl     time.Duration
	epoch   time.Time

	sweeps atomic.Uint32 // idle sweeps done: the current idle epoch

	mu sync.RWMutex
	m  map[string]*entry
	// Guarded by mu (write):
	ring      []*entry // every entry, for the eviction hand
	hand      int
	lastSweep int64 // clock of the last idle sweep
}

// entry.mark packs the idle epoch of the entry's last use (mark>>1) and a
// reference bit (mark&1) that Get sets and the eviction hand clears. A new
// entry starts unreferenced, so a burst of one-off keys evicts itself
// rather than the keys in steady use.
type entry struct {
	key  string
	b    *Breaker
	mark atomic.Uint32
	idx  int // position in ring; guarded by Group.mu
}

// NewGroup returns an empty group, or an error that Is ErrInvalidConfig
// and names every invalid field of cfg (cfg.Config's included).
func NewGroup(cfg GroupConfig) (*Group, error) {
	n, err := cfg.Config.normalize("GroupConfig.Config.")
	if cfg.MaxKeys < 0 {
		err = errors.Join(err, &configError{"GroupConfig.MaxKeys", cfg.MaxKeys, "a positive count, or zero for the default"})
	}
	if err != nil {
		return nil, err
	}
	g := &Group{
		cfg:     n,
		cfgFor:  cfg.ConfigFor,
		maxKeys: cfg.MaxKeys,
		ttl:     cfg.IdleTTL,
		epoch:   time.Now(),
		m:       make(map[string]*entry),
	}
	if g.maxKeys == 0 {
		g.maxKeys = DefaultMaxKeys
	}
	if g.ttl == 0 {
		g.ttl = DefaultIdleTTL
	}
	return g, nil
}

// Get returns the breaker for key, creating it if needed.
func (g *Group) Get(key string) *Breaker {
	g.mu.RLock()
	e := g.m[key]
	g.mu.RUnlock()
	if e != nil {
		e.touch(g.sweeps.Load())
		return e.b
	}
	return g.create(key)
}

func (g *Group) create(key string) *Breaker {
	n := g.cfg
	if g.cfgFor != nil {
		cfg := g.cfgFor(key)
		var err error
		if n, err = cfg.normalize("ConfigFor(" + strconv.Quote(key) + ")."); err != nil {
			panic(err)
		}
	}
	n.name = key
	b := newBreaker(n)

	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.m[key]; e != nil { // lost a race to create it
		e.touch(g.sweeps.Load())
		return e.b
	}
	now := int64(time.Since(g.epoch))
	if g.ttl > 0 && now-g.lastSweep >= int64(g.ttl) {
		g.sweepLocked()
		g.lastSweep = now
	}
	if len(g.ring) >= g.maxKeys {
		g.evictOneLocked()
	}
	e := &entry{key: key, b: b, idx: len(g.ring)}
	e.mark.Store(g.sweeps.Load() << 1)
	g.m[key] = e
	g.ring = append(g.ring, e)
	return b
}

// pinned reports whether e's breaker is open and its open time has not
// elapsed (or it was forced open): dropping it would let calls through to
// a dependency known to be down.
func (g *Group) pinned(e *entry) bool {
	w := e.b.state.Load()
	if w&stateMask != uint64(Open) {
		return false
	}
	if w&flagForced != 0 {
		return true
	}
	oe := e.b.openErr.Load()
	return oe != nil && e.b.clock() < oe.until
}

// touch marks e used in idle epoch epoch. It loads before it stores, so a
// key in steady use keeps its cache line shared between cores.
func (e *entry) touch(epoch uint32) {
	if m := epoch<<1 | 1; e.mark.Load() != m {
		e.mark.Store(m)
	}
}

// sweepLocked drops the entries neither created nor used since the
// previous sweep (at least IdleTTL ago), and starts a new idle epoch.
func (g *Group) sweepLocked() {
	epoch := g.sweeps.Load()
	for i := 0; i < len(g.ring); {
		e := g.ring[i]
		if e.mark.Load()>>1 == epoch&(1<<31-1) || g.pinned(e) {
			i++
			continue
		}
		g.removeLocked(e) // moves the last entry to i
	}
	g.sweeps.Add(1)
}

// evictOneLocked drops one entry, chosen by the clock algorithm (an
// approximation of least recently used that costs Get nothing): the hand
// skips entries used since it last passed, clearing their mark, and for one
// more turn skips open ones.
func (g *Group) evictOneLocked() {
	n := len(g.ring)
	for i := 0; i < 3*n; i++ {
		if g.hand >= len(g.ring) {
			g.hand = 0
		}
		e := g.ring[g.hand]
		if m := e.mark.Load(); m&1 != 0 {
			e.mark.CompareAndSwap(m, m&^1) // a Get racing with it wins
			g.hand++
			continue
		}
		if i < 2*n && g.pinned(e) {
			g.hand++
			continue
		}
		g.removeLocked(e)
		return
	}
	g.removeLocked(g.ring[0]) // unreachable: the third turn evicts
}

func (g *Group) removeLocked(e *entry) {
	delete(g.m, e.key)
	last := len(g.ring) - 1
	moved := g.ring[last]
	g.ring[e.idx] = moved
	moved.idx = e.idx
	g.ring[last] = nil
	g.ring = g.ring[:last]
}

// Remove drops the breaker for key, if any.
func (g *Group) Remove(key string) {
	g.mu.Lock()
	if e := g.m[key]; e != nil {
		g.removeLocked(e)
	}
	g.mu.Unlock()
}

// Len returns the number of breakers held.
func (g *Group) Len() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return len(g.m)
}

// Range calls fn for each breaker held, in no particular order, until fn
// returns false. It works on a snapshot, so fn may use the group.
func (g *Group) Range(fn func(key string, b *Breaker) bool) {
	g.mu.RLock()
	snap := make([]*entry, len(g.ring))
	copy(snap, g.ring)
	g.mu.RUnlock()
	for _, e := range snap {
		if !fn(e.key, e.b) {
			return
		}
	}
}
