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
	// set to the key. Its Observer sees the key as event.Event.Dependency. NewGroup validates it
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
	// past it, one that has not been used recently is dropped, preferring
	// one that is not open among the few dozen looked at (so that a group
	// whose breakers are nearly all open does not walk all of them for
	// every new key). Zero means DefaultMaxKeys (1000); a negative value is
	// invalid.
	MaxKeys int
	// IdleTTL drops breakers not used for at least IdleTTL, except one
	// still open. The check runs lazily: a sweep starts when a new key is
	// created at least IdleTTL after the previous one started, and drops
	// the breakers unused since then. It moves a bounded number of entries
	// forward at each new key rather than walking the group at once, so no
	// Get waits for it. Zero means DefaultIdleTTL (10 min); negative means
	// no limit: never drop for idleness (MaxKeys still bounds the group).
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
// Creating a key does a bounded amount of work whatever the group's size
// and whatever state its breakers are in (at most a few hundred entries
// looked at), so during a wide outage, when every breaker is open and new
// keys keep arriving, no Get waits long for the lock.
//
// Group is safe for concurrent use by multiple goroutines. Get on an
// existing key takes a read lock and allocates nothing.
type Group struct {
	cfg     normalized // shared by the breakers built from Config
	cfgFor  func(string) Config
	maxKeys int
	ttl     time.Duration

	sweeps atomic.Uint32 // idle epochs started: the current idle epoch

	mu sync.RWMutex
	m  map[string]*Breaker
	// Guarded by mu (write):
	ring      []*Breaker // every breaker, for the eviction hand and the sweep
	hand      int
	lastSweep int64  // clock of the start of the last idle sweep
	sweepPos  int    // next ring position of the sweep in progress; -1 when none
	sweepOld  uint32 // the idle epoch the sweep in progress drops the unused of
	scan      int    // entries the eviction hand may look at: 4..evictScan
}

// Bounds on the work of one key creation.
const (
	// evictScan is how many entries the eviction hand looks at, at most,
	// to choose one to drop. Beyond it, the preference for keeping open
	// breakers gives way: a wide outage must not make every new key walk
	// the whole group. After a look that found only open breakers the
	// hand looks at half as many next time (down to evictScanMin), and
	// after one that found a closed breaker twice as many: when nearly
	// everything is open, looking costs a cache miss per entry and finds
	// nothing.
	evictScan    = 64
	evictScanMin = 4
	// sweepStep is how many entries one key creation moves the idle sweep
	// over. It is larger than one, so a sweep always finishes: each
	// creation adds one entry and sweeps more.
	sweepStep = 128
)

// A breaker's gmark packs the idle epoch of its last use (gmark>>1) and a
// reference bit (gmark&1) that Get sets and the eviction hand clears. A new
// entry starts unreferenced, so a burst of one-off keys evicts itself
// rather than the keys in steady use.
const epochMask = 1<<31 - 1

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
	n.epoch = time.Now()
	g := &Group{
		cfg:      n,
		cfgFor:   cfg.ConfigFor,
		maxKeys:  cfg.MaxKeys,
		ttl:      cfg.IdleTTL,
		m:        make(map[string]*Breaker),
		sweepPos: -1,
		scan:     evictScan,
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
	b := g.m[key]
	g.mu.RUnlock()
	if b != nil {
		touch(b, g.sweeps.Load())
		return b
	}
	return g.create(key)
}

func (g *Group) create(key string) *Breaker {
	n := &g.cfg
	if g.cfgFor != nil {
		cfg := g.cfgFor(key)
		nk, err := cfg.normalize("ConfigFor(" + strconv.Quote(key) + ").")
		if err != nil {
			panic(err)
		}
		nk.epoch = g.cfg.epoch
		n = &nk
	}
	b := newBreaker(n, key)

	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.m[key]; e != nil { // lost a race to create it
		touch(e, g.sweeps.Load())
		return e
	}
	var now time.Time // read once, and only if needed
	if g.ttl > 0 {
		now = time.Now()
		if c := int64(now.Sub(g.cfg.epoch)); g.sweepPos < 0 && c-g.lastSweep >= int64(g.ttl) {
			g.sweepOld = g.sweeps.Load()
			g.sweeps.Add(1)
			g.sweepPos = 0
			g.lastSweep = c
		}
		if g.sweepPos >= 0 {
			g.sweepLocked(now)
		}
	}
	if len(g.ring) >= g.maxKeys {
		g.evictOneLocked(now)
	}
	b.gidx = int32(len(g.ring))
	b.gmark.Store(g.sweeps.Load() << 1)
	g.m[key] = b
	g.ring = append(g.ring, b)
	return b
}

// pinned reports whether b is open and its open time has not elapsed at
// *now (or it was forced open): dropping it would let calls through to a
// dependency known to be down. It reads the clock into *now if it is zero
// and needed, so that one walk reads it at most once.
func pinned(b *Breaker, now *time.Time) bool {
	w := b.state.Load()
	if w&stateMask != uint64(Open) {
		return false
	}
	if w&flagForced != 0 {
		return true
	}
	oe := b.openErr.Load()
	if oe == nil {
		return false
	}
	if now.IsZero() {
		*now = time.Now()
	}
	return b.clockAt(*now) < oe.until
}

// touch marks b used in idle epoch epoch. It loads before it stores, so a
// key in steady use keeps its cache line shared between cores.
func touch(b *Breaker, epoch uint32) {
	if m := epoch<<1 | 1; b.gmark.Load() != m {
		b.gmark.Store(m)
	}
}

// sweepLocked moves the idle sweep in progress over at most sweepStep
// entries. The sweep drops the entries neither created nor used in the
// idle epoch it started (at least IdleTTL before) nor since, except open
// ones. An entry moved behind the sweep by a removal elsewhere in the ring
// is left for the next sweep.
func (g *Group) sweepLocked(now time.Time) {
	keep1, keep2 := g.sweepOld&epochMask, (g.sweepOld+1)&epochMask
	for range sweepStep {
		if g.sweepPos >= len(g.ring) {
			g.sweepPos = -1
			return
		}
		b := g.ring[g.sweepPos]
		if e := b.gmark.Load() >> 1; e == keep1 || e == keep2 || pinned(b, &now) {
			g.sweepPos++
			continue
		}
		g.removeLocked(b) // moves the last entry to sweepPos
	}
}

// evictOneLocked drops one entry, chosen by the clock algorithm (an
// approximation of least recently used that costs Get nothing) over at most
// g.scan entries: the hand skips entries used since it last passed,
// clearing their mark, and open ones; the first entry that is neither is
// dropped. If the hand finds none, it drops the first entry it passed that
// is not open, or else the first it passed.
func (g *Group) evictOneLocked(now time.Time) {
	var notPinned, first *Breaker
	for range min(g.scan, len(g.ring)) {
		if g.hand >= len(g.ring) {
			g.hand = 0
		}
		b := g.ring[g.hand]
		g.hand++
		if first == nil {
			first = b
		}
		p := pinned(b, &now)
		if m := b.gmark.Load(); m&1 != 0 {
			b.gmark.CompareAndSwap(m, m&^1) // a Get racing with it wins
			if !p && notPinned == nil {
				notPinned = b
			}
			continue
		}
		if !p {
			g.scan = min(2*g.scan, evictScan)
			g.removeLocked(b)
			return
		}
	}
	if notPinned != nil {
		g.scan = min(2*g.scan, evictScan)
		g.removeLocked(notPinned)
	} else if first != nil {
		g.scan = max(g.scan/2, evictScanMin)
		g.removeLocked(first)
	}
}

func (g *Group) removeLocked(b *Breaker) {
	delete(g.m, b.name)
	last := len(g.ring) - 1
	moved := g.ring[last]
	g.ring[b.gidx] = moved
	moved.gidx = b.gidx
	g.ring[last] = nil
	g.ring = g.ring[:last]
}

// len returns the number of breakers held.
func (g *Group) len() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return len(g.m)
}

// Range calls fn for each breaker held, in no particular order, until fn
// returns false. It works on a snapshot, so fn may use the group.
func (g *Group) Range(fn func(key string, b *Breaker) bool) {
	g.mu.RLock()
	snap := make([]*Breaker, len(g.ring))
	copy(snap, g.ring)
	g.mu.RUnlock()
	for _, b := range snap {
		if !fn(b.name, b) {
			return
		}
	}
}
