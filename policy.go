package guardrail

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/throttle"
)

// Defaults used for zero Policy fields. Three attempts ride out a blip
// without multiplying the load of an outage by more than three (and the
// retry budget holds it far below that); 50 ms is about the least an
// attempt across a network needs, so less is not worth starting; 30 s is
// the longest a caller under a typical deadline can sensibly be asked to
// wait before its retry.
const (
	DefaultMaxAttempts    = 3
	DefaultMinAttemptTime = 50 * time.Millisecond
	DefaultMaxRetryAfter  = 30 * time.Second
)

// ErrInvalidConfig is wrapped by the error Do returns, without running the
// operation, when a Policy field holds a value that has no meaning (a
// negative MaxAttempts, say). The error names every such field, what it
// held and what is allowed.
var ErrInvalidConfig = errors.New("guardrail: invalid config")

// Policy is how calls to one dependency are guarded. Do applies it in a fixed
// order: deadline check, breaker, bulkhead, attempt under a timeout,
// classification, retry decision (attempts, deadline, budget), backoff.
//
// The zero value is valid and safe: 3 attempts, full jitter backoff from
// 100 ms capped at 10 s, a retry budget of 10 % (10 tokens) owned by the
// policy, Retry-After honoured up to 30 s, no retry of an operation not
// marked Idempotent unless the failure says nothing was sent, and a circuit
// breaker of its own. A nil *Policy means a process-wide zero Policy, whose
// budget all nil-policy calls share, without a breaker.
//
// A Policy is safe for concurrent use by any number of calls. Set its fields
// before the first call and do not change them afterwards; it must not be
// copied after first use (it holds its budget and breaker).
type Policy struct {
	// Name names the dependency in events and errors ("payments",
	// "pricing"). It becomes a metric label: keep it from a small fixed set.
	Name string

	// Retry is how the calls retry: attempts, their timeout, backoff,
	// server hints and the retry budget.
	Retry

	// Classify decides what a failed attempt means. Nil means
	// DefaultClassify.
	Classify Classifier

	// Idempotent reports that repeating the operation is harmless (a read,
	// or a write carrying an idempotency key). When false, the zero value,
	// Do retries only failures that say the request was never sent, and a
	// timed-out attempt ends with ErrOutcomeUnknown: the operation may have
	// taken effect. Call.Idempotent overrides it for one call.
	Idempotent bool

	// Breaker stops calls to a dependency that is failing, so callers fail
	// fast instead of waiting on it. Nil means a breaker owned by this
	// Policy with breaker's defaults (10 s window, at least 20 calls, 50 %
	// failures, open 30 s plus up to 20 % jitter, one probe), created on
	// first use, which reports its transitions to Observer; a nil *Policy
	// has none, having no one dependency to watch. To go without, set a
	// breaker built with breaker.Config{Mode: breaker.Disabled}. Share one
	// Breaker between policies that call the same failure domain; its
	// transitions go to the Observer of its own breaker.Config, not to the
	// policies' (each would report them once more, and the breaker would
	// keep every policy that ever used it alive).
	Breaker *breaker.Breaker

	// Bulkhead bounds the attempts in flight to the dependency, so a slow
	// one cannot take every goroutine, socket or connection of the process.
	// Nil means no bound. Do waits for a slot at most until the deadline
	// minus MinAttemptTime.
	Bulkhead *bulkhead.Bulkhead

	// Observer receives the call's events, and the transitions of the
	// breaker the Policy creates when Breaker is nil. Nil costs nothing.
	Observer event.Observer

	// Hedge, when not nil, hedges the idempotent calls made with DoHedged
	// (guardhttp uses it for idempotent requests): after a delay without an
	// answer another attempt is sent and the first success returned (see
	// HedgeConfig, and its cost: a goroutine per extra attempt, and load,
	// which is why it switches itself off under overload). Do and DoCall
	// never hedge. Nil, the default, never hedges.
	Hedge *HedgeConfig

	// Throttler, when not nil, rejects attempts locally, with ErrThrottled,
	// when the dependency has recently accepted too few of them (see
	// Throttler): a client that backs off before the dependency must shed.
	// Nil means no throttling. Share one Throttler between the policies
	// that call one dependency.
	Throttler *throttle.Throttler

	// Rand returns uniform draws in [0, 1) for backoff jitter and the
	// throttle's rejections. Nil means
	// math/rand/v2. Set it for reproducible runs; it must be safe for
	// concurrent use if the Policy is.
	Rand func() float64

	// resolved holds the validated settings, computed on first use.
	resolved atomic.Pointer[settings]
}

// Retry is how a guarded call retries: the settings that Policy,
// guardhttp.Config and guardgrpc.ClientConfig share, declared once here
// and embedded in each. The zero value is the defaults each field states.
// A Retry is a plain value; the Budget it points to is safe for concurrent
// use.
type Retry struct {
	// MaxAttempts bounds the attempts of one call, counting the first.
	// Zero means DefaultMaxAttempts (3); 1 never retries; a negative value
	// is rejected with ErrInvalidConfig.
	MaxAttempts int

	// AttemptTimeout bounds each attempt; the effective bound is
	// min(AttemptTimeout, time left on the context). Zero means no bound of
	// its own: the attempt runs under the caller's context alone, which then
	// is the context op receives. A negative value is rejected.
	AttemptTimeout time.Duration

	// MinAttemptTime is the least time worth starting an attempt with: with
	// less left on the context's deadline Do stops with ErrDeadline instead
	// of starting an attempt that cannot finish, and a retry whose delay
	// plus MinAttemptTime does not fit is not attempted. Zero means
	// DefaultMinAttemptTime (50 ms, about the least a network round trip
	// with some work behind it needs); negative means no limit: any time
	// left is worth an attempt.
	MinAttemptTime time.Duration

	// Backoff computes the delay before each retry. Nil means full jitter,
	// base 100 ms, cap 10 s.
	Backoff backoff.Strategy

	// MaxRetryAfter caps how long a server may ask Do to wait (Retry-After):
	// a longer request ends the call at once rather than retrying sooner than
	// asked. Zero means DefaultMaxRetryAfter (30 s); negative means no limit:
	// any wait the server asks for is honoured, as long as it fits in the
	// time left. (To ignore servers' hints, give a Classify that clears
	// Verdict.RetryAfter.)
	MaxRetryAfter time.Duration

	// Budget caps retries at a fraction of calls. Nil means a budget owned by
	// this Policy with budget.DefaultRatio and budget.DefaultMax, created on
	// first use. Share one Budget between policies to budget them together;
	// use budget.Unlimited() to bound retries only by attempts and deadline.
	Budget *budget.Budget

	// Pauses, when not nil, shares the pauses the dependency asks for with
	// the process's other calls and the fleet's other processes (a
	// fleet.Hints, whose Dependencies must name the dependency as the
	// call's events do: the Policy's Name or the Call's Dependency). Do
	// tells it every Retry-After an attempt was answered with, and asks
	// it before every attempt: a paused dependency is refused locally, as
	// an open breaker refuses it, with ErrCircuitOpen around ErrPaused
	// and RetryIn the rest of the pause; a retry whose own delay ends
	// before the pause waits for the pause instead (within MaxRetryAfter
	// and the deadline). Nil, the default, shares nothing: a Retry-After
	// delays only the call that was given it.
	Pauses Pauser
}

// Validate reports every field of r that holds an invalid value, as Do
// would at first use of a Policy holding it, for adapters and
// configuration that embed a Retry and want to fail at construction.
// owner is how the caller names the struct that holds r, as the prefix of
// each field's name: "guardhttp: Config" reports
// "guardhttp: Config.MaxAttempts is -1; want ...". The error Is
// ErrInvalidConfig.
func (r Retry) Validate(owner string) error {
	var errs []error
	r.check(func(field string, v any, want string) {
		errs = append(errs, &fieldError{fmt.Sprintf("%s.%s is %v; want %s", owner, field, v, want)})
	})
	return errors.Join(errs...)
}

// fieldError is an invalid field reported by Retry.Validate.
type fieldError struct{ msg string }

func (e *fieldError) Error() string        { return e.msg }
func (e *fieldError) Is(target error) bool { return target == ErrInvalidConfig }

// check reports each invalid field of r to bad.
func (r *Retry) check(bad func(field string, v any, want string)) {
	if r.MaxAttempts < 0 {
		bad("MaxAttempts", r.MaxAttempts, "1 or more, or zero for the default")
	}
	if r.AttemptTimeout < 0 {
		bad("AttemptTimeout", r.AttemptTimeout, "a positive duration, or zero for none")
	}
}

// settings are a Policy's fields with defaults applied.
type settings struct {
	err            error
	maxAttempts    int
	attemptTimeout time.Duration
	minAttempt     time.Duration
	backoff        backoff.Strategy
	maxRetryAfter  time.Duration // < 0: no limit
	classify       Classifier
	budget         *budget.Budget
	breaker        *breaker.Breaker // nil: none
	pauses         Pauser           // nil: none
	rand           func() float64
	hedge          *hedger // nil: no hedging
}

var defaultPolicy Policy

func (p *Policy) settings() *settings {
	if s := p.resolved.Load(); s != nil {
		return s
	}
	s := p.resolve()
	if p.resolved.CompareAndSwap(nil, s) {
		return s
	}
	return p.resolved.Load() // another call won; use its budget and breaker
}

func (p *Policy) resolve() *settings {
	s := &settings{
		maxAttempts:    p.MaxAttempts,
		attemptTimeout: p.AttemptTimeout,
		minAttempt:     p.MinAttemptTime,
		backoff:        p.Backoff,
		maxRetryAfter:  p.MaxRetryAfter,
		classify:       p.Classify,
		budget:         p.Budget,
		breaker:        p.Breaker,
		pauses:         p.Pauses,
		rand:           p.Rand,
	}
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, fmt.Errorf("%w %q: Policy.%s is %v; want %s", ErrInvalidConfig, p.Name, field, v, want))
	}
	p.Retry.check(bad)
	if p.Hedge != nil {
		s.hedge = newHedger(*p.Hedge, bad)
	}
	if s.maxAttempts == 0 {
		s.maxAttempts = DefaultMaxAttempts
	}
	switch {
	case s.minAttempt == 0:
		s.minAttempt = DefaultMinAttemptTime
	case s.minAttempt < 0:
		s.minAttempt = 0
	}
	if s.backoff == nil {
		s.backoff = backoff.Default()
	}
	if s.maxRetryAfter == 0 {
		s.maxRetryAfter = DefaultMaxRetryAfter
	}
	if s.classify == nil {
		s.classify = DefaultClassify
	}
	if s.budget == nil {
		s.budget = must(budget.New(budget.Config{})) // the zero Config is valid
	}
	if s.rand == nil {
		s.rand = rand.Float64
	}
	if s.breaker == nil && p != &defaultPolicy {
		// The Policy owns this breaker, so it, and only it, observes it.
		s.breaker = must(breaker.New(breaker.Config{Name: p.Name, Observer: p.Observer}))
	}
	s.err = errors.Join(errs...)
	return s
}

// must returns v, for constructors given a Config known to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// BreakerInUse returns the breaker Do asks before each attempt: Breaker
// if set, else the one the policy created on first use, or nil for a nil
// *Policy. A Call's Breaker replaces it for that call only.
func (p *Policy) BreakerInUse() *breaker.Breaker {
	if p == nil {
		return nil
	}
	return p.settings().breaker
}

// BudgetInUse returns the budget the policy spends retries from: Budget
// if set, else the one it created on first use (for metrics on its
// tokens). For a nil *Policy it is the budget all nil-policy calls share.
func (p *Policy) BudgetInUse() *budget.Budget {
	if p == nil {
		p = &defaultPolicy
	}
	return p.settings().budget
}
