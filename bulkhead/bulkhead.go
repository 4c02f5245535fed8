// Package bulkhead limits the calls in flight to one dependency, so that a
// slow dependency cannot hold every connection, thread or goroutine of its
// callers.
package bulkhead

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults used for zero Config fields.
const (
	DefaultMaxConcurrent = 10
	DefaultMaxWait       = time.Second
)

// ErrFull is returned when no slot became free: the queue was full, or
// MaxWait passed first.
var ErrFull = errors.New("bulkhead: full")

// ErrNoTime is returned by AcquireBy when no slot became free before its
// latest time (at once, without queueing, if that time had passed). It Is
// ErrFull.
var ErrNoTime error = &noTimeError{}

type noTimeError struct{}

func (*noTimeError) Error() string        { return "bulkhead: full, no slot in the time left" }
func (*noTimeError) Is(target error) bool { return target == ErrFull }

// Config configures a Bulkhead: a plain value that New copies. The zero
// Config is valid: 10 calls at once, no waiting.
type Config struct {
	// MaxConcurrent is the number of calls allowed in flight at once. Zero
	// or negative means DefaultMaxConcurrent (10).
	MaxConcurrent int
	// MaxQueue is the number of callers allowed to wait for a slot, in FIFO
	// order, when all are taken. Zero (or negative) means no waiting: a
	// full bulkhead rejects at once.
	MaxQueue int
	// MaxWait is the longest a caller waits in the queue; the context's
	// deadline, when sooner, ends the wait first. Zero or negative means
	// DefaultMaxWait (1 s). Unused when MaxQueue is zero.
	MaxWait time.Duration
}

// The state word packs the calls in flight (low half) and the callers
// queued (high half), so the uncontended paths are a single CAS.
const (
	flightMask = 1<<32 - 1
	waitUnit   = 1 << 32
)

// Bulkhead is a concurrency compartment: at most MaxConcurrent calls in
// flight, at most MaxQueue callers waiting, none longer than MaxWait or its
// context's deadline.
//
// Waiters are served in arrival order, and a newcomer never overtakes a
// waiter. Acquire and release allocate nothing when a slot is free.
//
// Bulkhead is safe for concurrent use by multiple goroutines.
type Bulkhead struct {
	state    atomic.Uint64 // in flight | queued<<32; see flightMask
	limit    uint64
	maxQueue uint64
	maxWait  time.Duration
	release  func() // b.releaseOne, bound once so Acquire does not allocate

	mu sync.Mutex
	// FIFO of waiters, guarded by mu. Its length is the queued half of
	// state, which changes only under mu. While anyone is queued every slot
	// is taken: a release hands its slot straight to the first waiter.
	head, tail *waiter
}

type waiter struct {
	ready      chan struct{} // closed when the waiter is handed a slot
	granted    bool          // guarded by mu
	prev, next *waiter
}

// New returns a Bulkhead configured by cfg.
func New(cfg Config) *Bulkhead {
	b := &Bulkhead{limit: DefaultMaxConcurrent, maxWait: cfg.MaxWait}
	if cfg.MaxConcurrent > 0 {
		b.limit = uint64(min(cfg.MaxConcurrent, flightMask))
	}
	if cfg.MaxQueue > 0 {
		b.maxQueue = uint64(min(cfg.MaxQueue, flightMask))
	}
	if b.maxWait <= 0 {
		b.maxWait = DefaultMaxWait
	}
	b.release = b.releaseOne
	return b
}

// Acquire takes a slot. It returns at once when one is free; otherwise it
// waits in the queue, at most MaxWait and never past ctx's deadline. It
// returns a release func, which must be called exactly once when the call
// ends (a second call releases someone else's slot, and a release with no
// slot held panics), or an error and no slot: ErrFull when the queue was
// full or MaxWait passed, ctx.Err() when ctx was done first (before the
// call or while waiting). On error the bulkhead is left as it was: a waiter
// that gives up just as a slot is handed to it passes the slot on.
//
// The returned func is the same for every call, so Acquire does not
// allocate on the uncontended path.
//
// Acquire waits up to the deadline itself; a caller that needs time left
// for the call after the wait uses AcquireBy.
func (b *Bulkhead) Acquire(ctx context.Context) (release func(), err error) {
	return b.AcquireBy(ctx, time.Time{})
}

// AcquireBy is Acquire with a wait that also ends at latest (the zero Time
// means no such limit), returning ErrNoTime then; if latest has already
// passed and no slot is free it fails at once, without queueing. A caller
// that needs some time left for the call itself passes its deadline minus
// that time, so it never waits for a slot it could not use.
func (b *Bulkhead) AcquireBy(ctx context.Context, latest time.Time) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// s < limit: nobody queued and a slot free. A CAS lost to another
	// acquire or release is retried here rather than in the slow path,
	// which would take the mutex: under contention that doubled the cost.
	for s := b.state.Load(); s < b.limit; s = b.state.Load() {
		if b.state.CompareAndSwap(s, s+1) {
			return b.release, nil
		}
	}
	return b.acquireSlow(ctx, latest)
}

func (b *Bulkhead) acquireSlow(ctx context.Context, latest time.Time) (func(), error) {
	wait, waitErr := b.maxWait, ErrFull
	if !latest.IsZero() {
		if left := time.Until(latest); left < wait {
			wait, waitErr = left, ErrNoTime
		}
	}
	if b.maxQueue == 0 || wait <= 0 {
		for {
			s := b.state.Load()
			if s >= b.limit {
				if b.maxQueue == 0 {
					return nil, ErrFull
				}
				return nil, waitErr // no time to wait
			}
			if b.state.CompareAndSwap(s, s+1) {
				return b.release, nil
			}
		}
	}
	b.mu.Lock()
	for {
		s := b.state.Load()
		if s < b.limit {
			if b.state.CompareAndSwap(s, s+1) {
				b.mu.Unlock()
				return b.release, nil
			}
			continue // a fast-path acquire or release raced us
		}
		if s>>32 >= b.maxQueue {
			b.mu.Unlock()
			return nil, ErrFull
		}
		// Queue. The CAS fails if a fast-path release freed a slot since
		// the load; then look again. Once queued, releases take the slow path.
		if b.state.CompareAndSwap(s, s+waitUnit) {
			break
		}
	}
	w := &waiter{ready: make(chan struct{})}
	if b.tail == nil {
		b.head = w
	} else {
		b.tail.next, w.prev = w, b.tail
	}
	b.tail = w
	b.mu.Unlock()

	var expired <-chan time.Time
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > wait {
		t := time.NewTimer(wait)
		defer t.Stop()
		expired = t.C
	} // else the deadline comes first: ctx.Done ends the wait
	select {
	case <-w.ready:
		return b.release, nil
	case <-expired:
		return b.giveUp(w, waitErr)
	case <-ctx.Done():
		return b.giveUp(w, ctx.Err())
	}
}

// giveUp leaves the queue. If a slot was handed to w meanwhile, a waiter
// whose time ran out takes it (it came in time); one whose context is done
// passes it on.
func (b *Bulkhead) giveUp(w *waiter, err error) (func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.granted {
		if err == ErrFull || err == ErrNoTime {
			return b.release, nil
		}
		b.releaseLocked()
		return nil, err
	}
	if w.prev == nil {
		b.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		b.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	b.state.Add(^uint64(waitUnit - 1)) // -waitUnit
	return nil, err
}

func (b *Bulkhead) releaseOne() {
	for {
		s := b.state.Load()
		if s&flightMask == 0 {
			panic("bulkhead: release of a slot not held")
		}
		if s>>32 != 0 {
			break
		}
		if b.state.CompareAndSwap(s, s-1) {
			return
		}
	}
	b.mu.Lock()
	b.releaseLocked()
	b.mu.Unlock()
}

// releaseLocked frees one slot, handing it to the first waiter if any.
// The caller holds mu.
func (b *Bulkhead) releaseLocked() {
	w := b.head
	if w == nil {
		b.state.Add(^uint64(0)) // -1 in flight; nobody queued, so no one else moves the queue half
		return
	}
	b.head = w.next
	if b.head == nil {
		b.tail = nil
	} else {
		b.head.prev = nil
	}
	w.next = nil
	w.granted = true
	b.state.Add(^uint64(waitUnit - 1)) // -waitUnit: the slot changes hands, in flight is unchanged
	close(w.ready)
}

// InFlight returns the number of slots taken.
func (b *Bulkhead) InFlight() int { return int(b.state.Load() & flightMask) }

// Waiting returns the number of callers queued for a slot.
func (b *Bulkhead) Waiting() int { return int(b.state.Load() >> 32) }

// Limit returns MaxConcurrent.
func (b *Bulkhead) Limit() int { return int(b.limit) }
