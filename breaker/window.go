package breaker

import (
	"sync"
	"sync/atomic"
)

// counts are a window's totals.
type counts struct {
	calls, failures, slow int64
}

// timeWindow is a ring of buckets, each holding the calls of one time slot
// (clock / width). A bucket is claimed for a new slot lazily by the first
// call that lands in it; readers skip buckets whose slot has left the
// window, so nothing has to run when time passes without calls.
//
// Recording is lock-free (one atomic add for a success); only claiming a
// bucket for a new slot takes the breaker's mutex, once per bucket width.
type timeWindow struct {
	width   int64 // ns per bucket
	buckets []bucket
}

type bucket struct {
	slot     atomic.Int64 // time slot held; -1 when empty
	calls    atomic.Int64
	failures atomic.Int64
	slow     atomic.Int64
	// No padding to a cache line: a Group holds thousands of breakers, and
	// only one bucket at a time is written, so its neighbours (read only
	// when a failure is recorded) cost little to share its line.
}

func (w *timeWindow) init(n *normalized) {
	w.width = int64(n.window) / int64(n.buckets)
	w.buckets = make([]bucket, n.buckets)
	w.reset()
}

// reset empties the window. The caller holds the breaker's mutex.
func (w *timeWindow) reset() {
	for i := range w.buckets {
		b := &w.buckets[i]
		b.slot.Store(-1)
		b.calls.Store(0)
		b.failures.Store(0)
		b.slow.Store(0)
	}
}

// add records one call at clock reading now. mu guards bucket claims.
//
// A call recorded concurrently with the claim of its bucket for a slot one
// full window later may land in the newer slot; that needs a goroutine to
// stall for a whole window between two instructions and only shifts one
// call in time.
func (w *timeWindow) add(mu *sync.Mutex, now int64, failure, slow bool) {
	if now < 0 {
		return
	}
	slot := now / w.width
	b := &w.buckets[slot%int64(len(w.buckets))]
	if s := b.slot.Load(); s != slot {
		if s > slot {
			return // older than the window
		}
		mu.Lock()
		switch s = b.slot.Load(); {
		case s > slot:
			mu.Unlock()
			return
		case s < slot:
			b.calls.Store(0)
			b.failures.Store(0)
			b.slow.Store(0)
			b.slot.Store(slot) // after the zeroing: a reader of slot sees zeroed counts
		}
		mu.Unlock()
	}
	// calls first: a reader loads failures and slow before calls, so it
	// never sees more failures than calls.
	b.calls.Add(1)
	if failure {
		b.failures.Add(1)
	}
	if slow {
		b.slow.Add(1)
	}
}

// sum returns the totals of the buckets still inside the window at now.
func (w *timeWindow) sum(now int64) counts {
	var c counts
	oldest := now/w.width - int64(len(w.buckets))
	for i := range w.buckets {
		b := &w.buckets[i]
		if b.slot.Load() <= oldest {
			continue
		}
		c.failures += b.failures.Load()
		c.slow += b.slow.Load()
		c.calls += b.calls.Load()
	}
	return c
}

// countWindow holds the outcomes of the last len(ring) calls. It is guarded
// by the breaker's mutex: exact, and a count window is rarely the hot
// default.
type countWindow struct {
	ring []uint8 // outcome bits of each call; 0 = empty
	next int
	counts
}

const (
	bitCall uint8 = 1 << iota
	bitFailure
	bitSlow
)

func newCountWindow(n int) *countWindow { return &countWindow{ring: make([]uint8, n)} }

func (w *countWindow) reset() {
	clear(w.ring)
	w.next = 0
	w.counts = counts{}
}

func (w *countWindow) add(failure, slow bool) {
	v := bitCall
	if failure {
		v |= bitFailure
	}
	if slow {
		v |= bitSlow
	}
	old := w.ring[w.next]
	w.ring[w.next] = v
	if w.next++; w.next == len(w.ring) {
		w.next = 0
	}
	w.calls += int64(v&bitCall) - int64(old&bitCall)
	w.failures += int64((v&bitFailure)>>1) - int64((old&bitFailure)>>1)
	w.slow += int64((v&bitSlow)>>2) - int64((old&bitSlow)>>2)
}
