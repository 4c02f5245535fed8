package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"
)

// Defaults used for zero SemaphoreConfig fields.
const (
	DefaultSemaphoreLimit = 10
	DefaultLeaseTTL       = 10 * time.Second
	// DefaultSemaphoreStoreTimeout bounds a Semaphore's store calls; a
	// Limiter's are bounded by DefaultStoreTimeout.
	DefaultSemaphoreStoreTimeout = 250 * time.Millisecond
	DefaultSemaphoreWait         = time.Second
)

// ErrFull is returned by Semaphore.Acquire when no slot of the fleet
// became free within MaxWait, and under FailOpen when this process's
// local share is taken. It Is bulkhead.ErrFull, so
// every place that maps a full bulkhead (guardrail.Do, respond, guardhttp,
// guardgrpc) maps it the same way.
var ErrFull error = &fullError{"fleet: semaphore full"}

// ErrStoreUnavailable is returned by Semaphore.Acquire in FailClosed mode
// when the store could not be reached in StoreTimeout; the error returned
// wraps the store's own. It Is ErrFull and so bulkhead.ErrFull: a call
// refused for want of a slot is refused alike whatever the cause.
var ErrStoreUnavailable error = &fullError{"fleet: semaphore store unavailable"}

type fullError struct{ msg string }

func (e *fullError) Error() string { return e.msg }
func (e *fullError) Is(target error) bool {
	return target == ErrFull || target == bulkhead.ErrFull
}

// SemaphoreStore holds the slots of a semaphore shared by a fleet: a set
// of holders, each with a lease that ends unless renewed, and a queue of
// waiters in arrival order. A Semaphore calls it; another engine (a
// database, a coordination service) implements it for its own storage.
//
// Every method is for one semaphore, name, and reads the time on the
// store's own clock, so processes whose clocks disagree agree on leases.
// Implementations must be safe for concurrent use.
type SemaphoreStore interface {
	// Acquire first reclaims what has lapsed: holders whose lease ended
	// and waiters whose place was not refreshed within ttl/2. It then
	// hands free slots to the waiters at the head of the queue, each for
	// ttl/3 (a waiter that died while queued so loses its slot soon), and
	// then to holder when fewer than limit slots are held and no waiter
	// is left ahead of it. A holder that gets a slot holds it for ttl.
	// One that does not is queued (or keeps its place, refreshed for
	// ttl/2) and learns its Position. Acquire is idempotent: called again
	// for a holder that already holds a slot, handed over or not, it
	// renews the lease for ttl and reports Held.
	//
	// So a slot held by a process that dies comes back within ttl, and
	// one handed to it while it waited within ttl/2 + ttl/3.
	Acquire(ctx context.Context, name string, limit int, holder string, ttl time.Duration) (SemaphoreState, error)
	// Renew extends the leases of holders by ttl from now and returns the
	// ones that no longer held a slot (their lease had lapsed and was
	// reclaimed). Like Acquire it may hand free slots to waiters.
	Renew(ctx context.Context, name string, limit int, holders []string, ttl time.Duration) (lost []string, err error)
	// Release frees holder's slot, or takes it out of the queue, and hands
	// the free slots to the waiters at the head of the queue. Releasing a
	// holder that holds nothing does nothing.
	Release(ctx context.Context, name string, limit int, holder string, ttl time.Duration) error
}

// SemaphoreNotifier is implemented by a SemaphoreStore that can tell a
// waiting process at once that a slot was handed to one of its waiters.
// Without it a waiter learns by asking again every PollInterval.
type SemaphoreNotifier interface {
	// Notify calls granted with each holder of name handed a slot while
	// queued, as soon as the store can tell, until stop is called. Missed
	// notices are allowed: a waiter still asks every PollInterval. stop
	// returns when granted will no longer be called.
	// ctx bounds the subscription's start only.
	Notify(ctx context.Context, name string, granted func(holder string)) (stop func(), err error)
}

// SemaphoreState is what a SemaphoreStore's Acquire reports.
type SemaphoreState struct {
	// Held reports that the holder holds a slot.
	Held bool
	// Position is the number of waiters ahead of the holder when it was
	// queued; zero when Held.
	Position int
	// InUse is the number of slots held across the fleet.
	InUse int
}

// SemaphoreConfig configures a Semaphore: a plain value that NewSemaphore
// copies. Store and Name are required; every other zero field means its
// default.
type SemaphoreConfig struct {
	// Store holds the slots. It is required.
	Store SemaphoreStore
	// Name identifies the semaphore in the store: every process that
	// shares the limit uses the same Name. It is required.
	Name string
	// Limit is the number of slots of the whole fleet: calls in flight at
	// once across every process using Name. Zero means
	// DefaultSemaphoreLimit (10); a negative value is invalid. Every
	// process of one Name should use the same Limit and LeaseTTL.
	Limit int
	// LeaseTTL is how long a slot stays held without a renewal: the most
	// a crashed holder's slot stays lost. A held slot is renewed every
	// LeaseTTL/3. Zero means DefaultLeaseTTL (10 s); allowed values are
	// 30 ms or more.
	LeaseTTL time.Duration
	// MaxWait is the longest Acquire waits for a slot; the context's
	// deadline, when sooner, ends the wait first. Zero means
	// DefaultSemaphoreWait (1 s); negative means no limit: only the
	// context ends the wait.
	MaxWait time.Duration
	// StoreTimeout bounds each call to the store. After a call fails,
	// Acquire leaves the store alone for as long and applies Mode at once,
	// so a store that is down costs a StoreTimeout per StoreTimeout, not
	// per call. Zero means DefaultSemaphoreStoreTimeout (250 ms); negative means no
	// limit beyond the caller's context, and no such pause.
	StoreTimeout time.Duration
	// PollInterval is how often a waiter asks the store whether a slot was
	// handed to it, which also keeps its place in the queue. Zero means
	// LeaseTTL/4 when the store is a SemaphoreNotifier (the poll then only
	// covers missed notices) and the lesser of 50 ms and LeaseTTL/4
	// otherwise; allowed values are 1 ms to LeaseTTL/4, so that a waiter
	// asks before its place (LeaseTTL/2) or a slot handed to it
	// (LeaseTTL/3) lapses.
	PollInterval time.Duration
	// OnStoreFailure is what Acquire does when the store fails, as a
	// Limiter's: FailOpen (the zero value) runs the call under a cap of
	// this process's own, its share of the limit, Limit / Members.Live()
	// (at least 1), without waiting, so the fleet stays near Limit as long
	// as Members counts it right; FailClosed refuses it with
	// ErrStoreUnavailable, so that no call runs that the fleet's count does
	// not include. For a third party that punishes a breach of its cap,
	// choose FailClosed.
	OnStoreFailure FailureMode
	// Members counts the live processes, for FailOpen's local share. Nil
	// means Fixed(1): each process alone then runs up to Limit while the
	// store fails, so set it for a fleet.
	Members Members
	// ID names this process in the store's records, such as its host or
	// pod name: every holder id this Semaphore gives the store starts with
	// ID and a slash, then a random part (so two Semaphores given one ID
	// never share a holder id) and a counter. Zero means the random part
	// only. It must not hold a space.
	ID string
	// Observer receives a BulkheadReject event for every refusal, with
	// Dependency set to Name. Nil means none.
	Observer event.Observer
}

// semInvalid reports one invalid field of a SemaphoreConfig. It Is
// ErrInvalidConfig.
func semInvalid(field string, got any, want string) error {
	return &configError{fmt.Sprintf("fleet: %s is %v; want %s", field, got, want)}
}

// Semaphore bounds the calls in flight across a fleet of processes: at
// most Limit at once, counted in a shared store. A slot is held under a
// lease the Semaphore renews while the call runs, so the slot of a
// process that dies comes back within LeaseTTL. Waiters are served in
// arrival order across the fleet, and none waits past MaxWait or its
// context's deadline.
//
// A Semaphore satisfies bulkhead.Shared, so it can back a Bulkhead
// (bulkhead.Config.Shared) and, through it, guardrail.Policy.Bulkhead and
// the guardhttp and guardgrpc bulkheads.
//
// Semaphore is safe for concurrent use by multiple goroutines. It starts
// one goroutine that renews leases while slots are held, and, when its
// store is a SemaphoreNotifier, keeps one subscription from the first wait
// until Close: a Semaphore whose callers never wait never subscribes.
type Semaphore struct {
	store        SemaphoreStore
	notifier     SemaphoreNotifier // nil: poll only
	name         string
	limit        int
	ttl          time.Duration
	maxWait      time.Duration // < 0: no limit
	storeTimeout time.Duration // < 0: no limit
	poll         time.Duration
	mode         FailureMode
	members      Members
	obs          event.Observer

	id  string // this Semaphore's part of every holder id
	seq atomic.Uint64

	local    atomic.Int64 // slots taken under FailOpen's local cap
	skipTill atomic.Int64 // UnixNano before which Acquire does not call the store

	mu       sync.Mutex
	held     map[string]struct{}      // holders with a slot in the store
	waiting  map[string]chan struct{} // holders queued; closed chan: notified
	renewing bool                     // the renewal goroutine runs
	wake     chan struct{}            // tells the renewal goroutine to look again
	stop     func()                   // ends the notifications; nil: none yet
	closed   bool
	// subscribing: an Acquire is starting the notifications; subscribed:
	// when the last start began.
	subscribing bool
	subscribed  time.Time
	subDone     chan struct{} // closed when the start under way ends
}

// NewSemaphore returns a Semaphore configured by cfg, or an error that Is
// ErrInvalidConfig and names every field cfg holds an invalid value in.
func NewSemaphore(cfg SemaphoreConfig) (*Semaphore, error) {
	var errs []error
	if cfg.Store == nil {
		errs = append(errs, semInvalid("SemaphoreConfig.Store", "nil", "a SemaphoreStore"))
	}
	if cfg.Name == "" {
		errs = append(errs, semInvalid("SemaphoreConfig.Name", `""`, "a non-empty name"))
	}
	if cfg.Limit < 0 {
		errs = append(errs, semInvalid("SemaphoreConfig.Limit", cfg.Limit, "1 or more, or zero for the default"))
	}
	ttl := cmpOr(cfg.LeaseTTL, DefaultLeaseTTL)
	if ttl < 30*time.Millisecond {
		errs = append(errs, semInvalid("SemaphoreConfig.LeaseTTL", cfg.LeaseTTL, "30ms or more, or zero for the default"))
	}
	n, _ := cfg.Store.(SemaphoreNotifier)
	poll := cfg.PollInterval
	switch {
	case poll == 0 && n != nil:
		poll = ttl / 4
	case poll == 0:
		poll = min(50*time.Millisecond, ttl/4)
	case poll < time.Millisecond || poll > ttl/4:
		errs = append(errs, semInvalid("SemaphoreConfig.PollInterval", cfg.PollInterval, "1ms to LeaseTTL/4, or zero for the default"))
	}
	if strings.ContainsAny(cfg.ID, " \t\n") {
		errs = append(errs, semInvalid("SemaphoreConfig.ID", strconv.Quote(cfg.ID), "an ID without white space"))
	}
	switch cfg.OnStoreFailure {
	case FailClosed, FailOpen:
	default:
		errs = append(errs, semInvalid("SemaphoreConfig.OnStoreFailure", cfg.OnStoreFailure, "FailOpen or FailClosed"))
	}
	if cfg.Members == nil {
		cfg.Members = Fixed(1)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	if cfg.ID != "" {
		id = cfg.ID + "/" + id
	}
	return &Semaphore{
		store:        cfg.Store,
		notifier:     n,
		name:         cfg.Name,
		limit:        cmpOr(cfg.Limit, DefaultSemaphoreLimit),
		ttl:          ttl,
		maxWait:      cmpOr(cfg.MaxWait, DefaultSemaphoreWait),
		storeTimeout: cmpOr(cfg.StoreTimeout, DefaultSemaphoreStoreTimeout),
		poll:         poll,
		mode:         cfg.OnStoreFailure,
		members:      cfg.Members,
		obs:          cfg.Observer,
		id:           id,
		held:         make(map[string]struct{}),
		waiting:      make(map[string]chan struct{}),
		wake:         make(chan struct{}, 1),
	}, nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Limit returns the fleet's number of slots.
func (s *Semaphore) Limit() int { return s.limit }

// Held returns the number of slots this process holds in the store, plus
// those it took under FailOpen's local cap.
func (s *Semaphore) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held) + int(s.local.Load())
}

// Waiting returns the number of this process's callers in Acquire that
// hold no slot yet: queued, or asking the store.
func (s *Semaphore) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// Acquire takes a slot of the fleet. It returns at once when one is free
// and nobody waits; otherwise it queues behind the fleet's earlier
// waiters, at most MaxWait and never past ctx's deadline. It returns the
// function that frees the slot, to call when the call ends (calling it
// again does nothing), or an error: ErrFull when MaxWait passed first,
// ctx.Err() when ctx was done first, and, when the store fails,
// ErrStoreUnavailable (FailClosed) or, under FailOpen, ErrFull if this
// process's local share is taken.
func (s *Semaphore) Acquire(ctx context.Context) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	holder := s.id + ":" + strconv.FormatUint(s.seq.Add(1), 36)
	// Listen before asking: a slot handed over between the store's answer
	// and the wait would otherwise go unnoticed until the next poll.
	notified := make(chan struct{})
	s.mu.Lock()
	s.waiting[holder] = notified
	s.mu.Unlock()
	defer s.forget(holder)
	if s.skipTill.Load() > time.Now().UnixNano() {
		return s.storeFailed(ctx, errStorePaused)
	}
	st, err := s.acquire(ctx, holder)
	if err == nil && !st.Held && s.startNotify(ctx) {
		// The first wait started the notifications: ask again, for a slot
		// handed over before they were on.
		st, err = s.acquire(ctx, holder)
	}
	if err != nil {
		if ctx.Err() != nil {
			s.leave(holder) // the store may have queued it before ctx ended
		}
		return s.storeFailed(ctx, err)
	}
	if st.Held {
		return s.hold(holder), nil
	}
	return s.wait(ctx, holder, notified)
}

// startNotify starts the store's notifications if the store has them and
// they are not on, for the first wait or the first one a poll interval
// after a failed start; waiters that come while they start wait for them.
// It reports whether they started during the call.
func (s *Semaphore) startNotify(ctx context.Context) bool {
	if s.notifier == nil {
		return false
	}
	s.mu.Lock()
	if s.subscribing {
		done := s.subDone
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
		}
		s.mu.Lock()
		on := s.stop != nil
		s.mu.Unlock()
		return on
	}
	if s.stop != nil || s.closed || time.Since(s.subscribed) < s.poll {
		s.mu.Unlock()
		return false
	}
	s.subscribing, s.subscribed = true, time.Now()
	done := make(chan struct{})
	s.subDone = done
	s.mu.Unlock()
	defer close(done)

	sctx, cancel := s.storeContext(ctx)
	defer cancel()
	stop, err := s.notifier.Notify(sctx, s.name, s.granted)
	s.mu.Lock()
	s.subscribing = false
	closed := s.closed
	if err == nil && !closed {
		s.stop = stop
	}
	s.mu.Unlock()
	if err == nil && closed {
		stop()
	}
	return err == nil && !closed
}

// forget drops holder's waiter.
func (s *Semaphore) forget(holder string) {
	s.mu.Lock()
	delete(s.waiting, holder)
	s.mu.Unlock()
}

func (s *Semaphore) acquire(ctx context.Context, holder string) (SemaphoreState, error) {
	sctx, cancel := s.storeContext(ctx)
	defer cancel()
	return s.store.Acquire(sctx, s.name, s.limit, holder, s.ttl)
}

// storeContext bounds one store call by StoreTimeout.
func (s *Semaphore) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.storeTimeout < 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.storeTimeout)
}

// wait waits in the queue for holder's slot.
func (s *Semaphore) wait(ctx context.Context, holder string, notified <-chan struct{}) (func(), error) {
	var expired <-chan time.Time
	if dl, ok := ctx.Deadline(); s.maxWait > 0 && (!ok || time.Until(dl) > s.maxWait) {
		t := time.NewTimer(s.maxWait)
		defer t.Stop()
		expired = t.C
	}
	poll := time.NewTimer(s.poll)
	defer poll.Stop()
	for {
		select {
		case <-notified:
			// The store handed the slot over for LeaseTTL/3: ask at
			// once, which takes the full lease.
			notified = nil
		case <-poll.C:
		case <-expired:
			return s.giveUp(ctx, holder, ErrFull)
		case <-ctx.Done():
			return s.giveUp(ctx, holder, ctx.Err())
		}
		st, err := s.acquire(ctx, holder)
		switch {
		case err != nil && ctx.Err() != nil:
			return s.giveUp(ctx, holder, ctx.Err())
		case err != nil:
			s.leave(holder)
			return s.storeFailed(ctx, err)
		case st.Held:
			return s.hold(holder), nil
		}
		poll.Reset(s.poll)
	}
}

// giveUp leaves the queue, passing on a slot handed over meanwhile.
func (s *Semaphore) giveUp(ctx context.Context, holder string, err error) (func(), error) {
	s.leave(holder)
	if err == ErrFull {
		s.reject(ctx, err)
	}
	return nil, err
}

// leave takes holder out of the store's queue, or frees the slot the store
// handed it; if the store cannot be told, the place lapses within LeaseTTL.
func (s *Semaphore) leave(holder string) {
	ctx, cancel := s.storeContext(context.Background())
	defer cancel()
	_ = s.store.Release(ctx, s.name, s.limit, holder, s.ttl)
}

// storeFailed applies Mode to a store failure.
func (s *Semaphore) storeFailed(ctx context.Context, err error) (func(), error) {
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if s.storeTimeout > 0 && err != errStorePaused {
		s.skipTill.Store(time.Now().Add(s.storeTimeout).UnixNano())
	}
	if s.mode == FailOpen {
		share := int64(max(s.limit/max(s.members.Live(), 1), 1))
		for n := s.local.Load(); n < share; n = s.local.Load() {
			if s.local.CompareAndSwap(n, n+1) {
				var once atomic.Bool
				return func() {
					if once.CompareAndSwap(false, true) {
						s.local.Add(-1)
					}
				}, nil
			}
		}
		s.reject(ctx, ErrFull)
		return nil, ErrFull
	}
	err = &storeError{err}
	s.reject(ctx, err)
	return nil, err
}

// errStorePaused is the cause of a refusal while Acquire leaves a store
// that just failed alone.
var errStorePaused = errors.New("the store failed less than StoreTimeout ago")

// storeError is ErrStoreUnavailable with the store's error.
type storeError struct{ err error }

func (e *storeError) Error() string { return ErrStoreUnavailable.Error() + ": " + e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }
func (e *storeError) Is(target error) bool {
	return target == ErrStoreUnavailable || ErrStoreUnavailable.(*fullError).Is(target)
}

func (s *Semaphore) reject(ctx context.Context, err error) {
	if s.obs == nil {
		return
	}
	s.obs.Observe(ctx, event.Event{
		Kind:       event.BulkheadReject,
		Dependency: s.name,
		Reason:     event.ReasonBulkheadFull,
		Err:        err,
		InFlight:   s.Held(),
		Limit:      s.limit,
		Remaining:  -1,
	})
}

// hold records holder's slot for renewal and returns its release.
func (s *Semaphore) hold(holder string) func() {
	s.mu.Lock()
	s.held[holder] = struct{}{}
	if !s.renewing {
		s.renewing = true
		go s.renew()
	}
	s.mu.Unlock()
	var once atomic.Bool
	return func() {
		if !once.CompareAndSwap(false, true) {
			return
		}
		s.mu.Lock()
		delete(s.held, holder)
		empty := len(s.held) == 0
		s.mu.Unlock()
		if empty {
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
		s.leave(holder)
	}
}

// renew renews every held lease each LeaseTTL/3, in one store call, and
// returns when nothing is held.
func (s *Semaphore) renew() {
	t := time.NewTimer(s.ttl / 3)
	defer t.Stop()
	var holders []string
	for {
		select {
		case <-t.C:
		case <-s.wake:
		}
		s.mu.Lock()
		if len(s.held) == 0 {
			s.renewing = false
			s.mu.Unlock()
			return
		}
		holders = holders[:0]
		for h := range s.held {
			holders = append(holders, h)
		}
		s.mu.Unlock()
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(s.ttl / 3)
		ctx, cancel := s.storeContext(context.Background())
		lost, err := s.store.Renew(ctx, s.name, s.limit, holders, s.ttl)
		cancel()
		if err != nil {
			continue // the leases last LeaseTTL: two more tries before they lapse
		}
		if len(lost) > 0 {
			s.mu.Lock()
			for _, h := range lost {
				delete(s.held, h) // its call runs on, no longer counted by the fleet
			}
			s.mu.Unlock()
		}
	}
}

// granted wakes holder's waiter, if it is this process's.
func (s *Semaphore) granted(holder string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.waiting[holder]; ok {
		delete(s.waiting, holder)
		close(ch)
	}
}

// Close ends the store's notifications, if any were started. Slots still
// held stay held, and renewed, until released, and the renewal goroutine
// ends with the last of them; waiters left, and later ones, poll. Close
// is safe to call more than once.
func (s *Semaphore) Close() error {
	s.mu.Lock()
	stop := s.stop
	s.stop, s.closed = nil, true
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	return nil
}
