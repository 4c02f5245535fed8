// Package throttle is client-side adaptive throttling: a client that
// stops sending what the dependency has lately been refusing.
package throttle

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Defaults of a zero Config. Two minutes is long enough that a
// short burst of refusals does not swing the rejection rate, and short
// enough that a recovered dependency is trusted again within minutes; a
// multiplier of 2 lets through twice what the dependency accepted, so the
// client keeps probing a recovering dependency with real requests, as the
// Google SRE book's client-side throttling does.
const (
	DefaultWindow = 2 * time.Minute
	DefaultK      = 2.0
)

// nBuckets is how many counters the window is cut into: the window
// slides in steps of Window/nBuckets.
const nBuckets = 32

// ErrInvalidConfig is what New's error Is when a Config field holds an
// invalid value.
var ErrInvalidConfig = errors.New("throttle: invalid config")

// Config configures a Throttler. The zero value is valid: a window
// of DefaultWindow, K of DefaultK. It is a plain value.
type Config struct {
	// Window is how far back the throttle looks. Zero means
	// DefaultWindow (2 minutes); a negative value is invalid, as a
	// throttle that forgets nothing would never trust a recovered
	// dependency again.
	Window time.Duration
	// K is how many requests the client sends per request the dependency
	// accepted before it starts rejecting locally: with K = 2, rejection
	// begins once fewer than half the requests are accepted. Zero means
	// DefaultK (2); a value below 1 is invalid (it would reject
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
// The window is nBuckets counters updated with atomics: no lock and
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
	buckets [nBuckets]bucket
}

type bucket struct {
	slot     atomic.Int64 // which bucket-width slot since epoch these counts are for
	requests atomic.Int64
	accepts  atomic.Int64
}

// New returns a Throttler configured by cfg, or an error naming
// every field of cfg that is invalid (it Is ErrInvalidConfig).
func New(cfg Config) (*Throttler, error) {
	var errs []error
	if cfg.Window < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.Window is %v; want a positive duration, or zero for the default (%v)", ErrInvalidConfig, cfg.Window, DefaultWindow))
	}
	if cfg.K != 0 && (cfg.K < 1 || math.IsNaN(cfg.K) || math.IsInf(cfg.K, 0)) {
		errs = append(errs, fmt.Errorf("%w: Config.K is %v; want 1 or more, or zero for the default (%v)", ErrInvalidConfig, cfg.K, DefaultK))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.K == 0 {
		cfg.K = DefaultK
	}
	t := &Throttler{k: cfg.K, width: max(int64(cfg.Window)/nBuckets, 1), epoch: time.Now()}
	for i := range t.buckets {
		t.buckets[i].slot.Store(math.MinInt64) // no slot: empty
	}
	return t, nil
}

// bucket returns the bucket of time now, reset if it held older counts.
func (t *Throttler) bucket(now time.Time) *bucket {
	slot := t.slot(now)
	b := &t.buckets[(slot%nBuckets+nBuckets)%nBuckets] // a time before epoch has a negative slot
	if old := b.slot.Load(); old != slot && b.slot.CompareAndSwap(old, slot) {
		b.requests.Store(0)
		b.accepts.Store(0)
	}
	return b
}

// slot numbers the step of the window that now falls in, counted from
// the Throttler's creation; negative for a time before it, which the
// twins that take the time may be given.
func (t *Throttler) slot(now time.Time) int64 {
	d := int64(now.Sub(t.epoch)) // saturates rather than wraps
	s := d / t.width
	if d < 0 && d%t.width != 0 {
		s-- // floor, so that steps before epoch are as wide as those after
	}
	return s
}

// counts sums the buckets still in the window at now.
func (t *Throttler) counts(now time.Time) (requests, accepts int64) {
	slot := t.slot(now)
	lo := int64(math.MinInt64) // the newest slot out of the window
	if slot > math.MinInt64+nBuckets {
		lo = slot - nBuckets
	}
	for i := range t.buckets {
		b := &t.buckets[i]
		if s := b.slot.Load(); s > lo && s <= slot {
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

// Admit reports whether a request may be sent at now; draw is a uniform
// draw in [0, 1). A rejected request is counted at once; one that is
// sent is counted when its answer is recorded with Record, so that
// requests still in flight do not count as refused.
func (t *Throttler) Admit(now time.Time, draw float64) bool {
	p := t.probability(t.counts(now))
	if p <= 0 || draw >= p {
		return true
	}
	t.bucket(now).requests.Add(1)
	return false
}

// Record counts a request that Admit let through and that was answered
// (or given up on) at now: accepted is false for an overload answer (429,
// 503, RESOURCE_EXHAUSTED) or a timeout, true for any other answer.
func (t *Throttler) Record(now time.Time, accepted bool) {
	b := t.bucket(now)
	b.requests.Add(1)
	if accepted {
		b.accepts.Add(1)
	}
}
