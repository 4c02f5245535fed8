// Package sim is a deterministic discrete-event simulator of clients that
// retry against a server of limited capacity.
package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
)

// Defaults of Config: a retry storm, 1000 clients failing together against
// a server that serves 100 requests per 100 ms.
const (
	DefaultClients     = 1000
	DefaultCapacity    = 100
	DefaultSlot        = 100 * time.Millisecond
	DefaultMaxAttempts = 10
)

// Limits of Config, so that a mistyped flag fails at once instead of
// exhausting memory.
const (
	ClientsLimit  = 10_000_000
	AttemptsLimit = 100_000
)

// ErrConfig is the sentinel of every configuration error returned by Run
// and Jitter.
var ErrConfig = errors.New("sim: invalid config")

// configError is an ErrConfig with the reason.
type configError struct{ msg string }

func (e *configError) Error() string        { return "sim: " + e.msg }
func (e *configError) Is(target error) bool { return target == ErrConfig }

func badConfig(format string, args ...any) error {
	return &configError{fmt.Sprintf(format, args...)}
}

// Config describes one scenario. The zero value is the retry storm of the
// defaults with full jitter: 1000 clients failing together at t=0, a server
// that serves 100 requests per 100 ms slot, at most 10 attempts, no budget,
// no deadline, seed 0. Run only reads a Config, so one may serve concurrent
// runs if its Backoff and CapacityAt are pure.
type Config struct {
	// Clients is the number of clients, each making one logical call.
	// Zero means DefaultClients; at most ClientsLimit.
	Clients int

	// Slot is the length of the server's capacity window. Zero means
	// DefaultSlot.
	Slot time.Duration

	// Capacity is the number of requests the server serves per slot; it
	// answers 503 to the rest. Zero means DefaultCapacity. Ignored when
	// CapacityAt is set.
	Capacity int

	// CapacityAt, when not nil, gives the capacity of the slot that starts
	// at start (a multiple of Slot), so that outages and recoveries can be
	// modelled; see Outage. It is called once per slot that receives a
	// request, in increasing order of start, and must be deterministic.
	// Negative results mean 0.
	CapacityAt func(start time.Duration) int

	// MaxAttempts caps the attempts of each client, counting the first call.
	// Zero means DefaultMaxAttempts; 1 means no retry; at most
	// AttemptsLimit.
	MaxAttempts int

	// Backoff computes the delay before each retry; the simulator supplies
	// the random draw. Nil means backoff.Default() (full jitter, base 100 ms,
	// cap 10 s).
	Backoff backoff.Strategy

	// Budget, when not nil, configures one retry budget shared by all
	// clients: each client's first call deposits, each retry spends a token,
	// and a client whose retry is refused gives up. Nil means no budget.
	// MinPerSecond must be zero: it refills by wall-clock time, which a
	// simulation does not have.
	Budget *budget.Config

	// Deadline, when positive, is each client's deadline measured from its
	// arrival: a retry is made only if it would start strictly before
	// arrival+Deadline; otherwise the client gives up at once, as
	// guardrail.Do does rather than sleep toward a deadline it would miss.
	// Zero means no deadline.
	Deadline time.Duration

	// Arrival says when the clients make their first call. The zero value
	// means all at t=0.
	Arrival Arrival

	// Seed drives every random draw (math/rand/v2 PCG): the same Config
	// gives the same Result.
	Seed uint64
}

// Arrival is the pattern of the clients' first calls. At most one field may
// be set; the zero value means every client arrives at t=0. It is a plain
// value, safe to copy and share.
type Arrival struct {
	// Spread, when positive, spaces the arrivals evenly over [0, Spread):
	// client i arrives at i*Spread/Clients.
	Spread time.Duration

	// Rate, when positive, makes the arrivals a Poisson process of Rate
	// clients per second starting at t=0 (exponential gaps drawn from the
	// seed). Client ids follow the arrival order.
	Rate float64
}

// Outage returns a capacity model for Config.CapacityAt: the server serves
// nothing in the slots that start before down (a failover, a dead
// dependency) and capacity per slot from then on.
func Outage(down time.Duration, capacity int) func(start time.Duration) int {
	return func(start time.Duration) int {
		if start < down {
			return 0
		}
		return capacity
	}
}

// Result is what one run of a scenario measured. Run returns a fresh one
// that nothing else references; like any value with slices, it is not safe
// for concurrent mutation.
type Result struct {
	Clients    int // clients simulated
	TotalCalls int // requests the server received, first calls and retries
	Retries    int // requests that were retries
	Succeeded  int // clients served

	// GaveUp counts clients that ended without being served; the three
	// fields after it split it by reason.
	GaveUp         int
	GaveUpAttempts int // MaxAttempts reached
	GaveUpDeadline int // the next retry would not start before the deadline
	GaveUpBudget   int // the retry budget refused the retry

	RetryPeak int // the most retries that landed in one slot
	CallPeak  int // the most requests that landed in one slot

	// AllDoneAt is when the last client finished, served or given up (the
	// time of its last request).
	AllDoneAt time.Duration

	// Slots is the time series, in increasing order of time. Slots that
	// received no request are omitted: use Slot.Index to place them.
	Slots []Slot

	// Attempts holds the attempts each client made, indexed by client id.
	Attempts []int
}

// Slot is what happened in one slot of the server: a plain value, safe to
// copy and share.
type Slot struct {
	Index    int64         // Start / Config.Slot
	Start    time.Duration // the slot covers [Start, Start+Config.Slot)
	Capacity int           // requests the server could serve in it
	Calls    int           // requests that arrived in it
	Retries  int           // those of them that were retries
	Served   int           // min(Calls, Capacity); the rest got 503
}

// Run simulates cfg and reports what happened. It returns an error wrapping
// ErrConfig for an invalid cfg, and ctx.Err() if ctx ends first (it checks
// every few thousand events). Run is safe to call concurrently; it shares
// nothing between calls except cfg's Backoff and CapacityAt, which must be
// pure.
//
// The semantics, exactly:
//
//   - Time is an integer number of nanoseconds from t=0. A request at time t
//     falls in slot floor(t/Slot): one that arrives exactly on a boundary
//     belongs to the slot that starts there.
//   - Requests are handled one at a time in order of arrival time, ties broken
//     by client id (lower first), whenever they were scheduled. The server
//     answers at once: the first Capacity requests of a slot are served, the
//     later ones get 503. Served clients are done.
//   - A client answered 503 after its attempt n gives up if n == MaxAttempts.
//     Otherwise it draws u in [0, 1) from its own random stream, asks Backoff
//     for Delay(n-1, prevDelay, u), gives up if a Deadline is set and
//     t+delay is not before its deadline, then gives up if the Budget refuses
//     the retry (so a retry refused for time spends no token), and otherwise
//     makes its next request at t+delay (which may be in the same slot).
//   - Each client has its own PCG stream derived from Seed, and draws exactly
//     once per 503 it may retry, whatever the strategy: the k-th draw of
//     client i is the same under every Backoff, so strategies compared on
//     one seed see the same luck (common random numbers).
func Run(ctx context.Context, cfg Config) (Result, error) {
	s, err := newRun(cfg)
	if err != nil {
		return Result{}, err
	}
	if err := s.loop(ctx); err != nil {
		return Result{}, err
	}
	return s.res, nil
}

// Streams of the seed: one derives the clients' streams, one draws arrivals.
const (
	streamClients  = 0x6a09e667f3bcc908
	streamArrivals = 0xbb67ae8584caa73b
)

type client struct {
	rng     rand.PCG
	arrival time.Duration
	prev    time.Duration // the last delay waited; 0 before the first retry
}

type run struct {
	cfg        Config
	slotLen    time.Duration
	capacity   func(time.Duration) int
	strategy   backoff.Strategy
	budget     *budget.Budget
	clients    []client
	queue      queue
	res        Result
	cur        *Slot // the slot being filled; nil before the first request
	maxAttempt int
}

func newRun(cfg Config) (*run, error) {
	switch {
	case cfg.Clients < 0 || cfg.Clients > ClientsLimit:
		return nil, badConfig("clients %d out of range [0, %d]", cfg.Clients, ClientsLimit)
	case cfg.Slot < 0:
		return nil, badConfig("negative slot %v", cfg.Slot)
	case cfg.Capacity < 0:
		return nil, badConfig("negative capacity %d", cfg.Capacity)
	case cfg.MaxAttempts < 0 || cfg.MaxAttempts > AttemptsLimit:
		return nil, badConfig("max attempts %d out of range [0, %d]", cfg.MaxAttempts, AttemptsLimit)
	case cfg.Deadline < 0:
		return nil, badConfig("negative deadline %v", cfg.Deadline)
	case cfg.Arrival.Spread < 0:
		return nil, badConfig("negative arrival spread %v", cfg.Arrival.Spread)
	case cfg.Arrival.Rate < 0 || math.IsNaN(cfg.Arrival.Rate) || math.IsInf(cfg.Arrival.Rate, 0):
		return nil, badConfig("arrival rate %v is not a finite non-negative number", cfg.Arrival.Rate)
	case cfg.Arrival.Spread > 0 && cfg.Arrival.Rate > 0:
		return nil, badConfig("arrival spread and rate are exclusive")
	case cfg.Budget != nil && cfg.Budget.MinPerSecond != 0:
		return nil, badConfig("budget MinPerSecond refills by wall-clock time and cannot be simulated")
	}
	s := &run{cfg: cfg}
	n := orDefault(cfg.Clients, DefaultClients)
	s.slotLen = orDefault(cfg.Slot, DefaultSlot)
	s.maxAttempt = orDefault(cfg.MaxAttempts, DefaultMaxAttempts)
	s.capacity = cfg.CapacityAt
	if s.capacity == nil {
		c := orDefault(cfg.Capacity, DefaultCapacity)
		s.capacity = func(time.Duration) int { return c }
	}
	s.strategy = cfg.Backoff
	if s.strategy == nil {
		s.strategy = backoff.Default()
	}
	if cfg.Budget != nil {
		var err error
		if s.budget, err = budget.New(*cfg.Budget); err != nil {
			return nil, err
		}
	}

	s.clients = make([]client, n)
	seeds := rand.NewPCG(cfg.Seed, streamClients)
	for i := range s.clients {
		s.clients[i].rng.Seed(seeds.Uint64(), seeds.Uint64())
	}
	s.arrivals(n)

	// Arrival times grow with the client id, so the list is already a heap.
	s.queue = make(queue, n, n+1)
	for i := range s.clients {
		s.queue[i] = event{at: s.clients[i].arrival, id: int32(i)}
	}
	s.res = Result{Clients: n, Attempts: make([]int, n)}
	return s, nil
}

// orDefault returns v, or def when v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// arrivals sets each client's arrival time, non-decreasing in the id.
func (s *run) arrivals(n int) {
	switch a := s.cfg.Arrival; {
	case a.Spread > 0:
		step, rem := a.Spread/time.Duration(n), a.Spread%time.Duration(n)
		for i := range s.clients {
			// i*Spread/n without overflow.
			s.clients[i].arrival = step*time.Duration(i) + rem*time.Duration(i)/time.Duration(n)
		}
	case a.Rate > 0:
		r := rand.New(rand.NewPCG(s.cfg.Seed, streamArrivals))
		var t float64 // seconds; the first client arrives at t=0
		for i := range s.clients {
			s.clients[i].arrival = seconds(t)
			t += r.ExpFloat64() / a.Rate
		}
	}
}

// seconds converts s seconds to a Duration, saturating.
func seconds(s float64) time.Duration {
	if ns := s * float64(time.Second); ns < math.MaxInt64 {
		return time.Duration(ns)
	}
	return math.MaxInt64
}

func (s *run) loop(ctx context.Context) error {
	for n := 0; len(s.queue) > 0; n++ {
		if n&4095 == 4095 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		s.handle(s.queue.pop())
	}
	return nil
}

// handle is one request of client e.id arriving at e.at.
func (s *run) handle(e event) {
	c := &s.clients[e.id]
	slot := s.slot(e.at)
	s.res.Attempts[e.id]++
	attempt := s.res.Attempts[e.id]
	s.res.TotalCalls++
	slot.Calls++
	s.res.CallPeak = max(s.res.CallPeak, slot.Calls)
	if attempt == 1 {
		if s.budget != nil {
			s.budget.Deposit()
		}
	} else {
		s.res.Retries++
		slot.Retries++
		s.res.RetryPeak = max(s.res.RetryPeak, slot.Retries)
	}
	s.res.AllDoneAt = e.at // events come in time order: the last one wins

	if slot.Served < slot.Capacity {
		slot.Served++
		s.res.Succeeded++
		return
	}
	if attempt >= s.maxAttempt {
		s.giveUp(&s.res.GaveUpAttempts)
		return
	}
	u := float64(c.rng.Uint64()>>11) * 0x1p-53
	delay := max(s.strategy.Delay(attempt-1, c.prev, u), 0)
	next := e.at + delay
	if next < e.at { // overflow
		next = math.MaxInt64
	}
	if s.cfg.Deadline > 0 && next-c.arrival >= s.cfg.Deadline {
		s.giveUp(&s.res.GaveUpDeadline)
		return
	}
	if s.budget != nil && !s.budget.TryRetry() {
		s.giveUp(&s.res.GaveUpBudget)
		return
	}
	c.prev = delay
	s.queue.push(event{at: next, id: e.id})
}

func (s *run) giveUp(reason *int) {
	s.res.GaveUp++
	*reason++
}

// slot returns the slot that t falls in, opening it if t is past the
// current one. Times never go back, so only the last slot can be open.
func (s *run) slot(t time.Duration) *Slot {
	idx := int64(t / s.slotLen)
	if s.cur != nil && s.cur.Index == idx {
		return s.cur
	}
	start := time.Duration(idx) * s.slotLen
	s.res.Slots = append(s.res.Slots, Slot{Index: idx, Start: start, Capacity: max(s.capacity(start), 0)})
	s.cur = &s.res.Slots[len(s.res.Slots)-1]
	return s.cur
}

// event is a request of client id arriving at time at.
type event struct {
	at time.Duration
	id int32
}

func (a event) before(b event) bool {
	return a.at < b.at || a.at == b.at && a.id < b.id
}

// queue is a binary min-heap of events ordered by (at, id). Each client has
// at most one pending event, so the order is total.
type queue []event

func (q *queue) push(e event) {
	*q = append(*q, e)
	h := *q
	i := len(h) - 1
	for i > 0 { // move the hole up rather than swap
		p := (i - 1) / 2
		if !e.before(h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = e
}

func (q *queue) pop() event {
	h := *q
	top := h[0]
	last := h[len(h)-1]
	h = h[:len(h)-1]
	*q = h
	n := len(h)
	if n == 0 {
		return top
	}
	i := 0
	for { // move the hole at the root down to where last belongs
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].before(h[l]) {
			m = r
		}
		if !h[m].before(last) {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = last
	return top
}
