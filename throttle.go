package guardrail

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Defaults of a zero ThrottleConfig. Two minutes is long enough that a
// short burst of refusals does not swing the rejection rate, and short
// enough that a recovered dependency is trusted again within minutes; a
// multiplier of 2 lets through twice what the dependency accepted, so the
// client keeps probing a recovering dependency with real requests, as the
// Google SRE book's client-side throttling does.
const (
	DefaultThrottleWindow = 2 * time.Minute
	DefaultThrottleK      = 2.0
)

// throttleBuckets is how many counters the window is cut into: the window
// slides in steps of Window/throttleBuckets.
const throttleBuckets = 32

// ErrThrottled: the adaptive throttle rejected the attempt locally, without
// sending it, because the dependency has recently been refusing more than
// it accepted (see Throttler).
var ErrThrottled = errors.New("guardrail: throttled")

// ThrottleConfig configures a Throttler. The zero value is valid: a window
// of DefaultThrottleWindow, K of DefaultThrottleK. It is a plain value.
type ThrottleConfig struct {
	// Window is how far back the throttle looks. Zero means
	// DefaultThrottleWindow (2 minutes); a negative value is invalid, as a
	// throttle that forgets nothing would never trust a recovered
	// dependency again.
	Window time.Duration
	// K is how many requests the client sends per request the dependency
	// accepted before it starts rejecting locally: with K = 2, rejection
	// begins once fewer than half the requests are accepted. Zero means
	// DefaultThrottleK (2); a value below 1 is invalid (it would reject
	// requests to a healthy dependency).
	K float64
}

// Throttler is client-side adaptive throttling, after the Google SRE book's
// "Handling Overload": over a sliding window it counts the requests the
// client attempted and the ones the dependency accepted, and rejects a new
// request locally with probability
//
//	max(0, (requests - K·accepts) / (requests + 1))
//
// An accept is any answer but an overload one (a Verdict with RetryAfter,
// an error whose Overload method reports true, such as an HTTP 429 or 503)
// and a timeout. Rejected requests count as requests, so a dependency that
// refuses everything sees its traffic fall to the few the throttle lets
// through to find out whether it recovered.
//
// The window is throttleBuckets counters updated with atomics: no lock and
// no allocation per call. A bucket is reset by the first call that finds
// it stale, so counts are approximate by at most the calls racing with a
// reset.
//
// A Throttler is safe for concurrent use. Share one between the policies
// that call one dependency.
type Throttler struct {
	k       float64
	width   int64 // nanoseconds per bucket
	epoch   time.Time
	buckets [throttleBuckets]throttleBucket
}

type throttleBucket struct {
	slot     atomic.Int64 // which bucket-width slot since epoch these counts are for
	requests atomic.Int64
	accepts  atomic.Int64
}

// NewThrottler returns a Throttler configured by cfg, or an error naming
// the field of cfg that is invalid (it Is ErrInvalidConfig).
func NewThrottler(cfg ThrottleConfig) (*Throttler, error) {
	if cfg.Window < 0 {
		return nil, fmt.Errorf("%w: ThrottleConfig.Window is %v; want a positive duration, or zero for the default (%v)", ErrInvalidConfig, cfg.Window, DefaultThrottleWindow)
	}
	if cfg.K != 0 && (cfg.K < 1 || math.IsNaN(cfg.K) || math.IsInf(cfg.K, 0)) {
		return nil, fmt.Errorf("%w: ThrottleConfig.K is %v; want 1 or more, or zero for the default (%v)", ErrInvalidConfig, cfg.K, DefaultThrottleK)
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultThrottleWindow
	}
	if cfg.K == 0 {
		cfg.K = DefaultThrottleK
	}
	t := &Throttler{k: cfg.K, width: max(int64(cfg.Window)/throttleBuckets, 1), epoch: time.Now()}
	for i := range t.buckets {
		t.buckets[i].slot.Store(-1)
	}
	return t, nil
}

// bucket returns the bucket of time now, reset if it held older counts.
func (t *Throttler) bucket(now time.Time) *throttleBucket {
	slot := int64(now.Sub(t.epoch)) / t.width
	b := &t.buckets[slot%throttleBuckets]
	if old := b.slot.Load(); old != slot && b.slot.CompareAndSwap(old, slot) {
		b.requests.Store(0)
		b.accepts.Store(0)
	}
	return b
}

// counts sums the buckets still in the window at now.
func (t *Throttler) counts(now time.Time) (requests, accepts int64) {
	slot := int64(now.Sub(t.epoch)) / t.width
	for i := range t.buckets {
		b := &t.buckets[i]
		if s := b.slot.Load(); s > slot-throttleBuckets && s <= slot {
			requests += b.requests.Load()
			accepts += b.accepts.Load()
		}
	}
	return requests, accepts
}

func (t *Throttler) probability(requests, accepts int64) float64 {
	return max(0, (float64(requests)-t.k*float64(accepts))/float64(requests+1))
}

// RejectProbability returns the probability with which a request would be
// rejected now, for metrics.
func (t *Throttler) RejectProbability() float64 {
	return t.probability(t.counts(time.Now()))
}

// Counts returns the requests and accepts in the window now, for metrics.
func (t *Throttler) Counts() (requests, accepts int64) { return t.counts(time.Now()) }

// admit reports whether a request may be sent at now: draw is a uniform
// draw in [0, 1). A rejected request is counted here; one that is sent is
// counted when its answer is recorded, so that requests still in flight
// do not count as refused.
func (t *Throttler) admit(now time.Time, draw float64) bool {
	p := t.probability(t.counts(now))
	if p <= 0 || draw >= p {
		return true
	}
	t.bucket(now).requests.Add(1)
	return false
}

// record counts a request sent that has been answered (or given up on) at
// now, and whether the dependency accepted it.
func (t *Throttler) record(now time.Time, accepted bool) {
	b := t.bucket(now)
	b.requests.Add(1)
	if accepted {
		b.accepts.Add(1)
	}
}

// Admit reports whether the caller may send a request, for callers that
// guard calls without Do; draw is a uniform draw in [0, 1). A rejected
// request is counted at once; report each admitted one's answer with
// Record.
func (t *Throttler) Admit(draw float64) bool { return t.admit(time.Now(), draw) }

// Record counts a request that Admit let through and that has been
// answered: accepted is false for an overload answer (429, 503,
// RESOURCE_EXHAUSTED) or a timeout, true for any other answer.
func (t *Throttler) Record(accepted bool) { t.record(time.Now(), accepted) }

// Overloader is implemented by errors that say the dependency is
// overloaded (an HTTP 429 or 503, a gRPC RESOURCE_EXHAUSTED): hedging stops
// and the throttle does not count the answer as accepted.
type Overloader interface {
	Overload() bool
}

// overloadError marks an error as an overload answer.
type overloadError struct{ err error }

func (e *overloadError) Error() string  { return e.err.Error() }
func (e *overloadError) Unwrap() error  { return e.err }
func (e *overloadError) Overload() bool { return true }

// Overloaded marks err as an answer that says the dependency is
// overloaded, for operations whose errors do not say so themselves. It
// keeps err's verdict (errors.As still finds what err wraps). A nil err
// stays nil.
func Overloaded(err error) error {
	if err == nil {
		return nil
	}
	return &overloadError{err}
}

// isOverload reports whether a failed attempt's error and verdict say the
// dependency is overloaded.
func isOverload(err error, v Verdict) bool {
	if v.RetryAfter > 0 {
		return true
	}
	var o Overloader
	return errors.As(err, &o) && o.Overload()
}
