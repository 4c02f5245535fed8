package breaker

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/guardrail-go/guardrail/event"
)

// Defaults used for zero Config fields. They are the safe defaults of
// guardrail: a 10 s window in 10 buckets, at least 20 calls, a 50 % failure
// rate, open for 30 s plus up to 20 % jitter, one probe. DefaultConfig
// returns them all.
const (
	// DefaultWindow is the length of the time window of a zero
	// Config.Window.
	DefaultWindow = 10 * time.Second
	// DefaultMinRequests is the volume a zero Config.MinRequests asks for.
	DefaultMinRequests = 20
)

// The other defaults, which DefaultConfig spells out.
const (
	defaultBuckets        = 10
	defaultFailureRate    = 0.5
	defaultSlowRate       = 0.5
	defaultOpenFor        = 30 * time.Second
	defaultOpenJitter     = 0.2
	defaultHalfOpenProbes = 1
)

// maxBuckets bounds the work of summing the window on a failure.
const maxBuckets = 1000

// maxConsecutive bounds ConsecutiveFailures: the run is counted in 16 bits.
const maxConsecutive = 1<<16 - 1

// maxCountWindow bounds the memory of a count window (one byte per call).
const maxCountWindow = 1 << 20

// Mode selects how much of the state machine runs. It is a plain value,
// safe for concurrent use.
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
// field's comment says what its zero value means and which values are
// allowed. New rejects any other value with an error that names the field
// (and Is ErrInvalidConfig): a mistyped threshold must not quietly become
// some other threshold. New copies the Config; the functions it holds are
// called concurrently by the breaker's users.
type Config struct {
	// Name identifies the breaker in transitions and errors (a dependency, a
	// host, a Group key). Empty is fine.
	Name string

	// Window is the length of the sliding time window over which rates are
	// computed. Zero means DefaultWindow (10 s); a negative value is invalid.
	Window time.Duration
	// Buckets is the number of buckets the time window is cut into; the
	// window slides one bucket at a time, so it covers between
	// Window*(Buckets-1)/Buckets and Window of history. Zero means 10
	// buckets, or one bucket per nanosecond of a Window shorter than that;
	// allowed values are 1 to 1000, and at most Window in nanoseconds.
	Buckets int
	// CountWindow, when positive, replaces the time window by the last
	// CountWindow calls (at most 1<<20, one byte per call). Zero means a
	// time window; a negative value is invalid.
	CountWindow int

	// MinRequests is the number of calls (successes plus failures; ignored
	// calls do not count) the window must hold before the breaker may trip.
	// Zero means DefaultMinRequests (20), or CountWindow when that is
	// smaller, so that a count window can fill up to it; 1 lets a single
	// failure trip the breaker (the behaviour of libraries whose volume
	// threshold defaults to 0: rarely what you want at low traffic). A
	// negative value, or one above a CountWindow, is invalid: the breaker
	// could never trip.
	MinRequests int
	// ConsecutiveFailures, when positive, also trips the breaker when that
	// many failures are recorded in a row while closed, whatever the
	// window holds: MinRequests does not apply. A success (slow or not)
	// ends the run; an ignored call neither counts nor ends it; a slow
	// success is a success here. Zero turns it off; a negative value, or
	// one above 65535, is invalid (a run that long is a failure rate).
	//
	// Pick the failure rate for a dependency busy enough to fill
	// MinRequests within the Window: it tolerates scattered failures and
	// trips on a real share of them. Pick ConsecutiveFailures (say 5) for
	// one called a few times a minute, whose window never holds
	// MinRequests calls, so that the rate never trips: a run of failures
	// is then the only evidence there will be. Both may be set; the
	// first condition met trips the breaker, with ReasonFailureRate (or
	// ReasonSlowRate) or ReasonConsecutiveFailures. At high traffic a run
	// of N failures among concurrent calls means that no call succeeded
	// between them, which is a strong signal too.
	ConsecutiveFailures int
	// FailureRate trips the breaker when failures/calls >= FailureRate
	// (inclusive). Zero means 0.5; allowed values are in (0, 1].
	FailureRate float64
	// SlowCall is the duration at or above which a call counts as slow, for
	// the slow-call rate; a slow failure counts as both, an ignored call as
	// neither. Zero turns slow-call tracking off; a negative value is
	// invalid.
	SlowCall time.Duration
	// SlowRate trips the breaker when slow/calls >= SlowRate (inclusive);
	// used only when SlowCall is set. Zero means 0.5; allowed values are
	// in (0, 1].
	SlowRate float64

	// OpenFor is how long the breaker stays open before it admits a probe.
	// Zero means 30 s; a negative value is invalid. It is also how long a
	// half-open breaker waits for a probe to report before it gives up on
	// the probes and opens again.
	OpenFor time.Duration
	// OpenJitter adds a random 0..OpenJitter fraction of the open time, so
	// that many instances that tripped together do not probe in lockstep.
	// Zero means 0.2; a negative value turns the jitter off, for a single
	// instance or a test that needs exact open times; other allowed values
	// are in (0, 1].
	OpenJitter float64
	// OpenBackoff, when above 1, multiplies the open time on each
	// consecutive re-open (a probe failed) up to MaxOpenFor; the count
	// restarts when the breaker closes. Zero or 1 means no growth; allowed
	// values are 0 and finite values of at least 1.
	OpenBackoff float64
	// MaxOpenFor caps the open time grown by OpenBackoff, before jitter.
	// Zero means 10 x OpenFor; a value that is negative or below OpenFor
	// is invalid.
	MaxOpenFor time.Duration

	// HalfOpenProbes is the number of probes admitted concurrently while
	// half-open. Zero means 1; a negative value is invalid.
	HalfOpenProbes int
	// CloseAfter is the number of consecutive successful probes that close
	// the breaker. Zero means HalfOpenProbes; a negative value is invalid.
	CloseAfter int

	// Mode selects normal operation, metrics-only or disabled. Zero means
	// Normal; a value other than the three constants is invalid.
	Mode Mode

	// Observer, if set, receives every state change as an
	// event.BreakerTransition whose Dependency is Name, Reason a Reason,
	// Detail the cause in words with the numbers ("failure rate 0.55 of 20
	// calls >= 0.5") and Delay the open time when To is open. It is called
	// synchronously on the goroutine that caused the change (or that was
	// delivering an earlier one), outside the breaker's lock, one at a time
	// and in order. It may call the breaker's methods. It should be fast.
	// Whoever builds a breaker observes it: a
	// guardrail.Policy passes its Observer only to the breaker it creates
	// itself, so a breaker shared by many policies reports each transition
	// once, to the Observer given here, and holds no reference to them.
	Observer event.Observer

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
		Buckets:        defaultBuckets,
		MinRequests:    DefaultMinRequests,
		FailureRate:    defaultFailureRate,
		SlowRate:       defaultSlowRate,
		OpenFor:        defaultOpenFor,
		OpenJitter:     defaultOpenJitter,
		MaxOpenFor:     10 * defaultOpenFor,
		HalfOpenProbes: defaultHalfOpenProbes,
		CloseAfter:     defaultHalfOpenProbes,
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
	epoch       time.Time // clock zero of the breakers built from it; the clock is time.Since(epoch)
	name        string
	window      time.Duration
	buckets     int
	count       int
	minRequests int64
	consecutive uint32 // 0 = off
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
	observer    event.Observer
	rand        func() float64
	classify    func(error) Outcome
}

// normalize checks c and applies its defaults. field prefixes the names
// of the fields in errors: "Config." for New, "GroupConfig.Config." for a
// Group.
func (c Config) normalize(field string) (normalized, error) {
	var errs []error
	bad := func(name string, v any, want string) {
		errs = append(errs, &configError{field + name, v, want})
	}
	n := normalized{
		name:     c.Name,
		window:   c.Window,
		buckets:  c.Buckets,
		count:    c.CountWindow,
		observer: c.Observer,
		rand:     c.Rand,
		classify: c.Classify,
		mode:     c.Mode,
	}
	c.normalizeWindow(&n, bad)
	c.normalizeTrip(&n, bad)
	c.normalizeOpen(&n, bad)
	if n.mode > Disabled {
		bad("Mode", uint8(c.Mode), "Normal, MetricsOnly or Disabled")
	}
	if n.rand == nil {
		n.rand = rand.Float64
	}
	if n.classify == nil {
		n.classify = DefaultClassify
	}
	return n, errors.Join(errs...)
}

// normalizeWindow checks and applies the fields of the window: Window,
// Buckets, CountWindow and MinRequests.
func (c Config) normalizeWindow(n *normalized, bad func(string, any, string)) {
	switch {
	case n.window == 0:
		n.window = DefaultWindow
	case n.window < 0:
		bad("Window", c.Window, "a positive duration, or zero for the default")
		n.window = DefaultWindow
	}
	switch {
	case n.buckets == 0:
		n.buckets = min(defaultBuckets, int(min(n.window, maxBuckets)))
	case n.buckets < 0 || n.buckets > maxBuckets:
		bad("Buckets", c.Buckets, "1 to 1000, or zero for the default")
	case time.Duration(n.buckets) > n.window:
		// A bucket must be at least 1ns wide.
		bad("Buckets", c.Buckets, "at most Window in nanoseconds ("+strconv.FormatInt(int64(n.window), 10)+")")
	}
	if n.count < 0 || n.count > maxCountWindow {
		bad("CountWindow", c.CountWindow, "0 to 1048576")
	}
	switch {
	case c.MinRequests == 0:
		n.minRequests = DefaultMinRequests
		if n.count > 0 && n.count < DefaultMinRequests {
			n.minRequests = int64(n.count)
		}
	case c.MinRequests < 0:
		bad("MinRequests", c.MinRequests, "a positive count, or zero for the default")
	case n.count > 0 && c.MinRequests > n.count:
		bad("MinRequests", c.MinRequests, "at most CountWindow ("+strconv.Itoa(n.count)+"), or the breaker could never trip")
	default:
		n.minRequests = int64(c.MinRequests)
	}
}

// normalizeTrip checks and applies the thresholds that trip a closed
// breaker: ConsecutiveFailures, FailureRate, SlowCall and SlowRate.
func (c Config) normalizeTrip(n *normalized, bad func(string, any, string)) {
	switch {
	case c.ConsecutiveFailures < 0 || c.ConsecutiveFailures > maxConsecutive:
		bad("ConsecutiveFailures", c.ConsecutiveFailures, "0 (off) to 65535")
	default:
		n.consecutive = uint32(c.ConsecutiveFailures)
	}
	n.failureRate = rate(c.FailureRate, defaultFailureRate, "FailureRate", bad)
	switch {
	case c.SlowCall > 0:
		n.slowCall = int64(c.SlowCall)
	case c.SlowCall < 0:
		bad("SlowCall", c.SlowCall, "a positive duration, or zero for no slow-call tracking")
	}
	n.slowRate = rate(c.SlowRate, defaultSlowRate, "SlowRate", bad)
}

// normalizeOpen checks and applies the fields of the open and half-open
// states: OpenFor, OpenJitter, OpenBackoff, MaxOpenFor, HalfOpenProbes and
// CloseAfter.
func (c Config) normalizeOpen(n *normalized, bad func(string, any, string)) {
	switch n.openFor = c.OpenFor; {
	case n.openFor == 0:
		n.openFor = defaultOpenFor
	case n.openFor < 0:
		bad("OpenFor", c.OpenFor, "a positive duration, or zero for the default")
		n.openFor = defaultOpenFor
	}
	switch j := c.OpenJitter; {
	case j < 0:
		n.jitter = 0
	case j == 0:
		n.jitter = defaultOpenJitter
	case !(j > 0 && j <= 1): // also NaN
		bad("OpenJitter", j, "a value in (0, 1], zero for the default or negative for none")
	default:
		n.jitter = j
	}
	switch b := c.OpenBackoff; {
	case b == 0 || b == 1:
	case !(b > 1) || math.IsInf(b, 1):
		bad("OpenBackoff", b, "zero, or a finite value of at least 1")
	default:
		n.backoff = b
	}
	switch n.maxOpenFor = c.MaxOpenFor; {
	case n.maxOpenFor == 0:
		n.maxOpenFor = 10 * n.openFor
		if n.maxOpenFor < n.openFor { // overflow
			n.maxOpenFor = n.openFor
		}
	case n.maxOpenFor < n.openFor:
		bad("MaxOpenFor", c.MaxOpenFor, "at least OpenFor ("+n.openFor.String()+"), or zero for 10 x OpenFor")
	}
	switch n.probes = c.HalfOpenProbes; {
	case n.probes == 0:
		n.probes = defaultHalfOpenProbes
	case n.probes < 0:
		bad("HalfOpenProbes", c.HalfOpenProbes, "a positive count, or zero for the default")
	}
	switch n.closeAfter = c.CloseAfter; {
	case n.closeAfter == 0:
		n.closeAfter = n.probes
	case n.closeAfter < 0:
		bad("CloseAfter", c.CloseAfter, "a positive count, or zero for HalfOpenProbes")
	}
}

// rate checks a threshold in (0, 1]; zero means def.
func rate(r, def float64, name string, bad func(string, any, string)) float64 {
	switch {
	case r == 0:
		return def
	case !(r > 0 && r <= 1): // also NaN
		bad(name, r, "a value in (0, 1], or zero for the default")
		return def
	}
	return r
}

// Config returns the breaker's effective configuration: the Config it was
// built from with every default applied, so that it can be logged beside a
// transition (an operator reading why a breaker opened needs the thresholds
// it opened on, not the zeros of a configuration file). No jitter shows as a
// negative OpenJitter; the callbacks are the ones in use. New accepts the result.
func (b *Breaker) Config() Config {
	n := b.cfg
	c := Config{
		Name:                b.name,
		Window:              n.window,
		Buckets:             n.buckets,
		CountWindow:         n.count,
		MinRequests:         int(n.minRequests),
		FailureRate:         n.failureRate,
		ConsecutiveFailures: int(n.consecutive),
		SlowCall:            time.Duration(n.slowCall),
		SlowRate:            n.slowRate,
		OpenFor:             n.openFor,
		OpenJitter:          n.jitter,
		OpenBackoff:         n.backoff,
		MaxOpenFor:          n.maxOpenFor,
		HalfOpenProbes:      n.probes,
		CloseAfter:          n.closeAfter,
		Mode:                n.mode,
		Observer:            n.observer,
		Rand:                n.rand,
		Classify:            n.classify,
	}
	if c.OpenJitter == 0 {
		c.OpenJitter = -1 // none: zero would mean the default
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
	if c.ConsecutiveFailures > 0 {
		attrs = append(attrs, slog.Int("consecutive_failures", c.ConsecutiveFailures))
	}
	if c.SlowCall > 0 {
		attrs = append(attrs, slog.Duration("slow_call", c.SlowCall), slog.Float64("slow_rate", c.SlowRate))
	}
	if c.OpenBackoff > 1 {
		attrs = append(attrs, slog.Float64("open_backoff", c.OpenBackoff), slog.Duration("max_open_for", c.MaxOpenFor))
	}
	return slog.GroupValue(attrs...)
}
