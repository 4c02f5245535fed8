package guardhttp

import (
	"sync"
	"sync/atomic"
	"time"
)

// A watchdog enforces the phase limits of native attempts (see native.go)
// by looking at what it watches every tick, instead of arming a runtime
// timer per phase. A timer armed and stopped for every request, as
// net/http's ResponseHeaderTimeout, a connection deadline or a per-request
// timer does, costs a few thousand instructions in the runtime's timer
// heap and its locks; that was most of what guarding a loopback request
// cost. Here a phase starts with a few atomic operations and no clock
// read: the watchdog times it from its first look at it (see
// guardConn.check), and a limit fires between its due time and two ticks
// later.
//
// The watchdog runs only while something it watches is in a timed phase:
// each tick is a time.AfterFunc that re-arms itself, and the last tick
// that finds nothing to time does not. No goroutine waits between ticks.
type watchdog struct {
	tick    time.Duration
	clock   func() int64 // nanotime; tests replace it
	running atomic.Bool

	mu    sync.Mutex
	items []watched
	timer *time.Timer // guarded by mu; nil until the first start
}

// watched is what a watchdog looks at: a connection (for its whole life)
// or the body of a response (while it is being read).
type watched interface {
	// check ends whatever ran out of time by now and reports whether it
	// is still in a timed phase. clock reads the time anew, for phases
	// that started since the last look.
	check(now int64, clock func() int64) bool
	// slot is where the watchdog keeps the item's index.
	slot() *int
}

// Ticks are a fraction of the shortest limit, so that a limit fires at
// most about 6 % late, within bounds that keep the sweep cheap.
const (
	minTick = time.Millisecond
	maxTick = 100 * time.Millisecond
)

// newWatchdog returns a watchdog for limits of which the shortest is
// shortest (0: none).
func newWatchdog(shortest time.Duration) *watchdog {
	tick := maxTick
	if shortest > 0 {
		tick = min(max(shortest/16, minTick), maxTick)
	}
	return &watchdog{tick: tick, clock: nanotime}
}

// shortestLimit returns the shortest positive limit the watchdog enforces
// for s, or 0.
func (s *settings) shortestLimit() time.Duration {
	var m time.Duration
	for _, d := range [...]time.Duration{s.write, s.header, s.bodyIdle} {
		if d > 0 && (m == 0 || d < m) {
			m = d
		}
	}
	return m
}

// add starts watching it. It does not start the ticks: wake does, once it
// is in a timed phase.
func (w *watchdog) add(it watched) {
	w.mu.Lock()
	*it.slot() = len(w.items)
	w.items = append(w.items, it)
	w.mu.Unlock()
}

// remove stops watching it. Removing what is not watched does nothing.
func (w *watchdog) remove(it watched) {
	w.mu.Lock()
	i := *it.slot()
	if i >= 0 && i < len(w.items) && w.items[i] == it {
		last := len(w.items) - 1
		moved := w.items[last]
		w.items[i] = moved
		*moved.slot() = i
		w.items[last] = nil
		w.items = w.items[:last]
		*it.slot() = -1
	}
	w.mu.Unlock()
}

// wake makes sure the ticks run. Call it after putting an item in a timed
// phase: either the ticks see the phase, or wake sees them stopped and
// starts them (see sweep).
func (w *watchdog) wake() {
	if w.running.Load() || !w.running.CompareAndSwap(false, true) {
		return
	}
	w.mu.Lock()
	if w.timer == nil {
		w.timer = time.AfterFunc(w.tick, w.sweep)
	} else {
		w.timer.Reset(w.tick)
	}
	w.mu.Unlock()
}

// sweep is one tick: it checks every item, and arms the next tick unless
// none is in a timed phase.
func (w *watchdog) sweep() {
	if w.scan() {
		w.rearm()
		return
	}
	// Nothing to time: stop, then look again, for an item that entered a
	// timed phase while running was still true and so did not wake us.
	w.running.Store(false)
	if w.scan() && w.running.CompareAndSwap(false, true) {
		w.rearm()
	}
}

func (w *watchdog) rearm() {
	w.mu.Lock()
	w.timer.Reset(w.tick)
	w.mu.Unlock()
}

// scan checks every item and reports whether any is in a timed phase. An
// item ends what ran out outside the lock: ending closes connections and
// bodies, which may remove items.
func (w *watchdog) scan() bool {
	now := w.clock()
	w.mu.Lock()
	items := append([]watched(nil), w.items...)
	w.mu.Unlock()
	active := false
	for _, it := range items {
		if it.check(now, w.clock) {
			active = true
		}
	}
	return active
}
