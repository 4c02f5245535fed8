// Package bulkhead limits the calls in flight to one dependency, so that a
// slow dependency cannot hold every connection, thread or goroutine of its
// callers.
package bulkhead

import (
	"context"
	"errors"
	"fmt"
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

// ErrInvalidConfig is the sentinel of every error New returns for a Config
// it rejects; the error names the field, what it held and what is allowed.
var ErrInvalidConfig = errors.New("bulkhead: invalid config")

// Config configures a Bulkhead: a plain value that New copies. The zero
// Config is valid: 10 calls at once, no waiting.
type Config struct {
	// MaxConcurrent is the number of calls allowed in flight at once. Zero
	// means DefaultMaxConcurrent (10); allowed values are 1 to 1<<32-1.
	MaxConcurrent int
	// MaxQueue is the number of callers allowed to wait for a slot, in FIFO
	// order, when all are taken. Zero means no waiting: a full bulkhead
	// rejects at once. Allowed values are 0 to 1<<32-1.
	MaxQueue int
	// MaxWait is the longest a caller waits in the queue; the context's
	// deadline, when sooner, ends the wait first. Zero means DefaultMaxWait
	// (1 s); negative means no limit: only the context ends the wait.
	// Unused when MaxQueue is zero, except to bound the wait for Shared.
	MaxWait time.Duration
	// Shared, when not nil, is a count of slots kept outside this
	// Bulkhead, such as a fleet.Semaphore that bounds the calls of a whole
	// fleet. A call then takes one of this Bulkhead's slots, which bound
	// this process as before, and then one of Shared's, waiting for it at
	// most MaxWait (whatever MaxQueue is) and never past the context's
	// deadline or AcquireBy's latest time; Slot.Release frees both. Every
	// compartment of a Group shares the one Shared. Nil means none: the
	// Bulkhead counts only its own slots.
	Shared Shared
}

// Shared is a count of slots kept outside a Bulkhead and shared with
// other Bulkheads or processes; fleet.Semaphore is one. Acquire takes a
// slot, waiting no longer than ctx allows, and returns the function that
// frees it, or an error: one that Is ErrFull when no slot became free,
// ctx.Err() when ctx ended the wait. It must be safe for concurrent use.
type Shared interface {
	Acquire(ctx context.Context) (release func(), err error)
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
// waiter. Acquire and Release allocate nothing when a slot is free and
// the Bulkhead has no Shared.
//
// Bulkhead is safe for concurrent use by multiple goroutines.
type Bulkhead struct {
	state    atomic.Uint64 // in flight | queued<<32; see flightMask
	limit    uint64
	maxQueue uint64
	maxWait  time.Duration // < 0: no limit
	shared   Shared        // nil: none

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

// New returns a Bulkhead configured by cfg, or an error that Is
// ErrInvalidConfig and names every field cfg holds an invalid value in.
func New(cfg Config) (*Bulkhead, error) {
	if errs := cfg.validate("Config."); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	b := &Bulkhead{limit: DefaultMaxConcurrent, maxQueue: uint64(cfg.MaxQueue), maxWait: cfg.MaxWait, shared: cfg.Shared}
	if cfg.MaxConcurrent > 0 {
		b.limit = uint64(cfg.MaxConcurrent)
	}
	if b.maxWait == 0 {
		b.maxWait = DefaultMaxWait
	}
	return b, nil
}

// validate returns one error per invalid field of cfg, each naming the
// field after prefix ("Config." for New, "GroupConfig.Config." for
// NewGroup).
func (cfg Config) validate(prefix string) []error {
	var errs []error
	if cfg.MaxConcurrent < 0 || cfg.MaxConcurrent > flightMask {
		errs = append(errs, &configError{prefix + "MaxConcurrent", cfg.MaxConcurrent, "1 to 4294967295, or zero for the default"})
	}
	if cfg.MaxQueue < 0 || cfg.MaxQueue > flightMask {
		errs = append(errs, &configError{prefix + "MaxQueue", cfg.MaxQueue, "0 to 4294967295"})
	}
	return errs
}

// configError reports one invalid field. It Is ErrInvalidConfig.
type configError struct {
	field string // as written in Go: "Config.MaxQueue"
	value int
	want  string
}

func (e *configError) Error() string {
	return fmt.Sprintf("bulkhead: %s is %d; want %s", e.field, e.value, e.want)
}

func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }

// Slot is a slot taken from a Bulkhead by Acquire or AcquireBy. Release
// frees it; releasing it again, or releasing the zero Slot, does nothing,
// so an early Release followed by a deferred one is safe:
//
//	slot, err := bh.Acquire(ctx)
//	if err != nil {
//		return err
//	}
//	defer slot.Release()
//
// Call Release through the variable Acquire's result was stored in: each
// copy of a Slot would free the slot again, so a Slot must not be copied
// (go vet reports copies). A Slot is not safe for concurrent use; the
// Bulkhead is.
type Slot struct {
	_      noCopy
	b      *Bulkhead
	shared func() // frees the Shared slot; nil: none
}

// Release frees the slot, handing it to the first waiter if any, and the
// Shared slot taken with it. Only the first Release of a Slot frees them.
func (s *Slot) Release() {
	if b := s.b; b != nil {
		s.b = nil
		if r := s.shared; r != nil {
			s.shared = nil
			r()
		}
		b.releaseOne()
	}
}

// noCopy makes go vet's copylocks check report copies of a Slot.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// Acquire takes a slot. It returns at once when one is free; otherwise it
// waits in the queue, at most MaxWait and never past ctx's deadline. It
// returns the Slot, to Release when the call ends, or an error and the
// zero Slot: ErrFull when the queue was full or MaxWait passed, ctx.Err()
// when ctx was done first (before the call or while waiting). On error the
// bulkhead is left as it was: a waiter that gives up just as a slot is
// handed to it passes the slot on.
//
// Acquire waits up to the deadline itself; a caller that needs time left
// for the call after the wait uses AcquireBy.
func (b *Bulkhead) Acquire(ctx context.Context) (Slot, error) {
	return b.AcquireBy(ctx, time.Time{})
}

// AcquireBy is Acquire with a wait that also ends at latest (the zero Time
// means no such limit), returning ErrNoTime then; if latest has already
// passed and no slot is free it fails at once, without queueing. A caller
// that needs some time left for the call itself passes its deadline minus
// that time, so it never waits for a slot it could not use.
func (b *Bulkhead) AcquireBy(ctx context.Context, latest time.Time) (Slot, error) {
	if err := ctx.Err(); err != nil {
		return Slot{}, err
	}
	// s < limit: nobody queued and a slot free. A CAS lost to another
	// acquire or release is retried here rather than in the slow path,
	// which would take the mutex: under contention that doubled the cost.
	for s := b.state.Load(); s < b.limit; s = b.state.Load() {
		if b.state.CompareAndSwap(s, s+1) {
			if b.shared != nil {
				return b.acquireShared(ctx, latest)
			}
			return Slot{b: b}, nil
		}
	}
	if err := b.acquireSlow(ctx, latest); err != nil {
		return Slot{}, err
	}
	if b.shared != nil {
		return b.acquireShared(ctx, latest)
	}
	return Slot{b: b}, nil
}

// acquireShared takes a Shared slot for a caller that holds one of b's,
// freeing b's if it gets none.
func (b *Bulkhead) acquireShared(ctx context.Context, latest time.Time) (Slot, error) {
	wait, waitErr := b.maxWait, ErrFull // wait < 0: no limit
	if !latest.IsZero() {
		if left := time.Until(latest); wait < 0 || left < wait {
			wait, waitErr = max(left, 0), ErrNoTime
		}
	}
	sctx := ctx
	if wait >= 0 {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	release, err := b.shared.Acquire(sctx)
	if err != nil {
		b.releaseOne()
		if ctx.Err() == nil && sctx.Err() != nil && !errors.Is(err, ErrFull) {
			err = waitErr // our bound, not the caller's, ended the wait
		}
		return Slot{}, err
	}
	return Slot{b: b, shared: release}, nil
}

// acquireSlow takes one of b's slots, queueing for it if need be.
func (b *Bulkhead) acquireSlow(ctx context.Context, latest time.Time) error {
	wait, waitErr := b.maxWait, ErrFull // wait < 0: no limit
	if !latest.IsZero() {
		if left := time.Until(latest); wait < 0 || left < wait {
			wait, waitErr = max(left, 0), ErrNoTime
		}
	}
	if b.maxQueue == 0 || wait == 0 {
		for {
			s := b.state.Load()
			if s >= b.limit {
				if b.maxQueue == 0 {
					return ErrFull
				}
				return waitErr // no time to wait
			}
			if b.state.CompareAndSwap(s, s+1) {
				return nil
			}
		}
	}
	b.mu.Lock()
	for {
		s := b.state.Load()
		if s < b.limit {
			if b.state.CompareAndSwap(s, s+1) {
				b.mu.Unlock()
				return nil
			}
			continue // a fast-path acquire or release raced us
		}
		if s>>32 >= b.maxQueue {
			b.mu.Unlock()
			return ErrFull
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
	if dl, ok := ctx.Deadline(); wait > 0 && (!ok || time.Until(dl) > wait) {
		t := time.NewTimer(wait)
		defer t.Stop()
		expired = t.C
	} // else no limit, or the deadline comes first: ctx.Done ends the wait
	select {
	case <-w.ready:
		return nil
	case <-expired:
		return b.giveUp(w, waitErr)
	case <-ctx.Done():
		return b.giveUp(w, ctx.Err())
	}
}

// giveUp leaves the queue. If a slot was handed to w meanwhile, a waiter
// whose time ran out takes it (it came in time); one whose context is done
// passes it on.
func (b *Bulkhead) giveUp(w *waiter, err error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.granted {
		if err == ErrFull || err == ErrNoTime {
			return nil
		}
		b.releaseLocked()
		return err
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
	return err
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
