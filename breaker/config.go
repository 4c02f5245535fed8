package breaker

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"
)

// Defaults used for zero (or invalid) Config fields. They are the safe
// defaults of guardrail: a 10 s window in 10 buckets, at least 20 calls,
// a 50 % failure rate, open for 30 s plus up to 20 % jitter, one probe.
const (
	DefaultWindow         = 10 * time.Second
	DefaultBuckets        = 10
	DefaultMinRequests    = 20
	DefaultFailureRate    = 0.5
	DefaultSlowRate       = 0.5
	DefaultOpenFor        = 30 * time.Second
	DefaultOpenJitter     = 0.2
	DefaultHalfOpenProbes = 1
)

// maxBuckets bounds the work of summing the window on a failure.
const maxBuckets = 1000

// maxCountWindow bounds the memory of a count window (one byte per call).
const maxCountWindow = 1 << 20

// Mode selects how much of the state machine runs.
type Mode uint8

const (
	// Normal records calls and trips on the thresholds.
	Normal Mode = iota
	// MetricsOnly records calls (Metrics reports rates) but never trips:
	// for trying thresholds on live traffic before enforcing them.
	MetricsOnly
	// Disabled admits every call and records nothing.
	Disabled
)

// String returns "normal", "metrics_only" or "disabled".
func (m Mode) String() string {
	switch m {
	case MetricsOnly:
		return "metrics_only"
	case Disabled:
		return "disabled"
	default:
		return "normal"
	}
}

// Config configures a Breaker. The zero Config is the safe default; every
// field's comment says what its zero value means. Invalid values (negative
// where not documented, NaN, rates above 1) are replaced by the default
// rather than rejected, so a bad configuration file degrades to the default
// instead of to no protection. New copies the Config; the functions it
// holds are called concurrently by the breaker's users.
type Config struct {
	// Name identifies the breaker in transitions and errors (a dependency, a
	// host, a Group key). Empty is fine.
	Name string

	// Window is the length of the sliding time window over which rates are
	// computed. Zero means DefaultWindow (10 s).
	Window time.Duration
	// Buckets is the number of buckets the time window is cut into; the
	// window slides one bucket at a time, so it covers between
	// Window*(Buckets-1)/Buckets and Window of history. Zero means
	// DefaultBuckets (10); values above 1000 are capped.
	Buckets int
	// CountWindow, when positive, replaces the time window by the last
	// CountWindow calls (capped at 1<<20). Zero means a time window.
	CountWindow int

	// MinRequests is the number of calls (successes plus failures; ignored
	// calls do not count) the window must hold before the breaker may trip.
	// Zero means DefaultMinRequests (20); a negative value means no minimum,
	// so a single failure can trip it (the behaviour of libraries whose
	// volume threshold defaults to 0: rarely what you want at low traffic).
	// With a count window, a minimum above CountWindow is lowered to
	// CountWindow, or the breaker could never trip.
	MinRequests int
	// FailureRate trips the breaker when failures/calls >= FailureRate
	// (inclusive). Zero, negative, NaN or above 1 means DefaultFailureRate
	// (0.5).
	FailureRate float64
	// SlowCall is the duration at or above which a call counts as slow, for
	// the slow-call rate; a slow failure counts as both, an ignored call as
	// neither. Zero (or negative) turns slow-call tracking off.
	SlowCall time.Duration
	// SlowRate trips the breaker when slow/calls >= SlowRate (inclusive);
	// used only when SlowCall is set. Zero, negative, NaN or above 1 means
	// DefaultSlowRate (0.5).
	SlowRate float64

	// OpenFor is how long the breaker stays open before it admits a probe.
	// Zero (or negative) means DefaultOpenFor (30 s). It is also how long a
	// half-open breaker waits for a probe to report before it gives up on
	// the probes and opens again.
	OpenFor time.Duration
	// OpenJitter adds a random 0..OpenJitter fraction of the open time, so
	// that many instances that tripped together do not probe in lockstep.
	// Zero or NaN means DefaultOpenJitter (0.2); negative means no jitter;
	// values above 1 are capped at 1.
	OpenJitter float64
	// OpenBackoff, when above 1, multiplies the open time on each
	// consecutive re-open (a probe failed) up to MaxOpenFor; the count
	// restarts when the breaker closes. Zero (or any value <= 1 or NaN)
	// means no growth.
	OpenBackoff float64
	// MaxOpenFor caps the open time grown by OpenBackoff, before jitter.
	// Zero (or below OpenFor) means 10 x OpenFor.
	MaxOpenFor time.Duration

	// HalfOpenProbes is the number of probes admitted concurrently while
	// half-open. Zero (or negative) means DefaultHalfOpenProbes (1).
	HalfOpenProbes int
	// CloseAfter is the number of consecutive successful probes that close
	// the breaker. Zero (or negative) means HalfOpenProbes.
	CloseAfter int

	// Mode selects normal operation, metrics-only or disabled. Zero means
	// Normal.
	Mode Mode

	// OnTransition, if set, is called on every state change, synchronously
	// on the goroutine that caused it (or that was delivering an earlier
	// one), outside the breaker's lock, one at a time and in order. It may
	// call the breaker's methods. It should be fast.
	OnTransition func(Transition)

	// Rand returns a uniformly random number in [0, 1) for the jitter.
	// Nil means math/rand/v2's Float64. Set it for reproducible tests. It is
	// called under the breaker's lock, but breakers sharing a Config (a
	// Group) call it concurrently: it must then be safe for concurrent use,
	// which a *rand.Rand's Float64 is not.
	Rand func() float64

	// Classify maps an error to an Outcome for Execute. Nil means
	// DefaultClassify.
	Classify func(error) Outcome
}

// DefaultConfig returns the Config with every default filled in: the
// values a zero Config gets, spelled out, as a starting point to change.
func DefaultConfig() Config {
	return Config{
		Window:         DefaultWindow,
		Buckets:        DefaultBuckets,
		MinRequests:    DefaultMinRequests,
		FailureRate:    DefaultFailureRate,
		SlowRate:       DefaultSlowRate,
		OpenFor:        DefaultOpenFor,
		OpenJitter:     DefaultOpenJitter,
		MaxOpenFor:     10 * DefaultOpenFor,
		HalfOpenProbes: DefaultHalfOpenProbes,
		CloseAfter:     DefaultHalfOpenProbes,
	}
}

// DefaultClassify is the classifier Execute uses when Config.Classify is
// nil: nil is a Success, a caller's cancellation (context.Canceled) is
// Ignored, anything else is a Failure. context.DeadlineExceeded is a
// Failure: a dependency that does not answer in time is unhealthy.
func DefaultClassify(err error) Outcome {
	switch {
	case err == nil:
		return Success
	case errors.Is(err, context.Canceled):
		return Ignored
	default:
		return Failure
	}
}

// normalized is Config with defaults applied, in the units the hot path
// uses.
type normalized struct {
	name        string
	window      time.Duration
	buckets     int
	count       int
	minRequests int64
	failureRate float64
	slowCall    int64 // ns; 0 = off
	slowRate    float64
	openFor     time.Duration
	jitter      float64
	backoff     float64
	maxOpenFor  time.Duration
	probes      int
	closeAfter  int
	mode        Mode
	onTrans     func(Transition)
	rand        func() float64
	classify    func(error) Outcome
}

func validRate(r, def float64) float64 {
	if math.IsNaN(r) || r <= 0 || r > 1 {
		return def
	}
	return r
}

func (c Config) normalize() normalized {
	n := normalized{
		name:     c.Name,
		window:   c.Window,
		buckets:  c.Buckets,
		count:    c.CountWindow,
		onTrans:  c.OnTransition,
		rand:     c.Rand,
		classify: c.Classify,
		mode:     c.Mode,
	}
	if n.window <= 0 {
		n.window = DefaultWindow
	}
	if n.buckets <= 0 {
		n.buckets = DefaultBuckets
	}
	if n.buckets > maxBuckets {
		n.buckets = maxBuckets
	}
	if time.Duration(n.buckets) > n.window {
		// A bucket must be at least 1ns wide.
		n.buckets = int(n.window)
	}
	if n.count < 0 {
		n.count = 0
	}
	if n.count > maxCountWindow {
		n.count = maxCountWindow
	}
	switch {
	case c.MinRequests == 0:
		n.minRequests = DefaultMinRequests
	case c.MinRequests < 0:
		n.minRequests = 1 // no minimum: rates need at least one call
	default:
		n.minRequests = int64(c.MinRequests)
	}
	if n.count > 0 && n.minRequests > int64(n.count) {
		n.minRequests = int64(n.count)
	}
	n.failureRate = validRate(c.FailureRate, DefaultFailureRate)
	if c.SlowCall > 0 {
		n.slowCall = int64(c.SlowCall)
	}
	n.slowRate = validRate(c.SlowRate, DefaultSlowRate)
	n.openFor = c.OpenFor
	if n.openFor <= 0 {
		n.openFor = DefaultOpenFor
	}
	switch j := c.OpenJitter; {
	case j == 0 || math.IsNaN(j):
		n.jitter = DefaultOpenJitter
	case j < 0:
		n.jitter = 0
	case j > 1:
		n.jitter = 1
	default:
		n.jitter = j
	}
	if b := c.OpenBackoff; b > 1 && !math.IsInf(b, 1) {
		n.backoff = b
	}
	n.maxOpenFor = c.MaxOpenFor
	if n.maxOpenFor < n.openFor {
		n.maxOpenFor = 10 * n.openFor
		if n.maxOpenFor < n.openFor { // overflow
			n.maxOpenFor = n.openFor
		}
	}
	n.probes = c.HalfOpenProbes
	if n.probes <= 0 {
		n.probes = DefaultHalfOpenProbes
	}
	n.closeAfter = c.CloseAfter
	if n.closeAfter <= 0 {
		n.closeAfter = n.probes
	}
	if n.mode > Disabled {
		n.mode = Normal
	}
	if n.rand == nil {
		n.rand = rand.Float64
	}
	if n.classify == nil {
		n.classify = DefaultClassify
	}
	return n
}

// Config returns the breaker's effective configuration: the Config it was
// built from with every default and correction applied, so that it can be
// logged beside a transition (seed 000: log the cause and the effective
// configuration). "No minimum" shows as MinRequests 1 (a rate needs one
// call), no jitter as OpenJitter -1; the callbacks are the ones in use.
func (b *Breaker) Config() Config {
	n := b.cfg
	c := Config{
		Name:           n.name,
		Window:         n.window,
		Buckets:        n.buckets,
		CountWindow:    n.count,
		MinRequests:    int(n.minRequests),
		FailureRate:    n.failureRate,
		SlowCall:       time.Duration(n.slowCall),
		SlowRate:       n.slowRate,
		OpenFor:        n.openFor,
		OpenJitter:     n.jitter,
		OpenBackoff:    n.backoff,
		MaxOpenFor:     n.maxOpenFor,
		HalfOpenProbes: n.probes,
		CloseAfter:     n.closeAfter,
		Mode:           n.mode,
		OnTransition:   n.onTrans,
		Rand:           n.rand,
		Classify:       n.classify,
	}
	if c.OpenJitter == 0 {
		c.OpenJitter = -1
	}
	return c
}

// LogValue renders the configuration for log/slog: the numbers, not the
// callbacks.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.Duration("window", c.Window),
		slog.Int("buckets", c.Buckets),
		slog.Int("min_requests", c.MinRequests),
		slog.Float64("failure_rate", c.FailureRate),
		slog.Duration("open_for", c.OpenFor),
		slog.Float64("open_jitter", c.OpenJitter),
		slog.Int("half_open_probes", c.HalfOpenProbes),
		slog.Int("close_after", c.CloseAfter),
		slog.String("mode", c.Mode.String()),
	}
	if c.CountWindow > 0 {
		attrs = append(attrs, slog.Int("count_window", c.CountWindow))
	}
	if c.SlowCall > 0 {
		attrs = append(attrs, slog.Duration("slow_call", c.SlowCall), slog.Float64("slow_rate", c.SlowRate))
	}
	if c.OpenBackoff > 1 {
		attrs = append(attrs, slog.Float64("open_backoff", c.OpenBackoff), slog.Duration("max_open_for", c.MaxOpenFor))
	}
	return slog.GroupValue(attrs...)
}
