// Package guardrail runs calls to a dependency under one policy of deadlines,
// safe retries, a retry budget, a circuit breaker and a bulkhead.
//
// # Conventions
//
// Every package of guardrail follows the same rules, so that what is learnt
// in one holds in all.
//
// Zero values. A zero field of a Config, or of a Policy, means the default
// its comment documents, with its value, and a zero Config is valid and
// safe. A default is also exported as a constant where code outside its
// package needs it (guardrail.DefaultMaxAttempts, which the adapters and
// the policy file report), or, where people want to start from ours, as a
// DefaultConfig function (breaker.DefaultConfig).
//
// Negative values. A negative duration or size turns that limit off, and
// only in the fields whose comment says "negative means no limit" (a
// timeout, a wait, a size cap). In every other field (a count, a ratio, a
// threshold) a negative value means nothing, and it is invalid. guardrail
// never replaces an invalid value with a default.
//
// Invalid values are reported as early as the type allows, by an error that
// names the field, what it held and what is allowed:
//
//	breaker: Config.FailureRate is 1.5; want a value in (0, 1]
//
// Every such error wraps its package's ErrInvalidConfig, whose message is
// "<package>: invalid config" (the root's is guardrail.ErrInvalidConfig, for
// a Policy), and names every invalid field, not only the first.
//
// A type built by a constructor reports at construction: every New that
// takes a Config returns (*T, error). A plain struct used without a
// constructor, such as Policy, reports at first use: Do returns the error
// without running the operation.
//
// Middleware. Every server-side piece (chain.Server, deadline.Server, shed.Shedder,
// idempotency.Server, fault.Injector, the OpenTelemetry adapter) is a value
// built by New with a method
//
//	Middleware(next http.Handler) http.Handler
//
// whose method value is the func(http.Handler) http.Handler that routers
// take: r.Use(dl.Middleware, sh.Middleware, keys.Middleware). Client-side
// pieces wrap an http.RoundTripper; a nil one means http.DefaultTransport.
//
// Randomness. A field that draws random numbers is a Rand func() float64
// returning uniform draws in [0, 1); nil means math/rand/v2. It must be safe
// for concurrent use when the value that holds it is; a *rand.Rand adapts
// as a method value, r.Float64, behind a mutex.
//
// Names. A duration's name says what it bounds (AttemptTimeout,
// MinAttemptTime, OpenFor); a count's name says what it counts
// (MaxAttempts). A package has a sentinel error per condition callers test
// for, with the package name as the prefix of its message, and a typed
// error only where it carries data; a typed error that stands for such a
// condition Is its sentinel (breaker.OpenError Is breaker.ErrOpen), and one
// that is the only error its function returns needs none
// (fallback.PartError).
//
// Events. Every package reports through one event.Observer, in the
// vocabulary of package event. A nil Observer costs nothing.
//
// Time. Whatever reads the clock has a twin that takes the time as a
// parameter (breaker.AllowAt, throttle.Throttler.Admit), as
// x/time/rate's AllowN(t, n) does, so tests are exact without sleeping and
// Do reads the clock once where one reading serves several checks.
//
// Concurrency. Every exported type says whether it is safe for concurrent
// use. Nothing in guardrail starts a goroutine per call, with one
// exception that asks for it: a hedged call (DoHedged) runs each extra
// attempt on a goroutine of its own.
package guardrail
