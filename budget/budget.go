// Package budget caps retry traffic at a fraction of original traffic.
package budget

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Defaults used for zero Config fields: one retry for every ten calls, and
// a burst of ten retries after a quiet period. They match gRPC's
// retryThrottling defaults, which hold retry traffic to a tenth of the
// traffic while leaving a healthy dependency's rare retries untouched.
const (
	DefaultRatio = 0.1
	DefaultMax   = 10
)

// ErrInvalidConfig is the sentinel of every error New returns for a Config
// it rejects; the error names the field, what it held and what is allowed.
var ErrInvalidConfig = errors.New("budget: invalid config")

// configError reports one invalid field. It Is ErrInvalidConfig.
type configError struct {
	field string
	value float64
	want  string
}

func (e *configError) Error() string {
	return fmt.Sprintf("budget: Config.%s is %v; want %s", e.field, e.value, e.want)
}

func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }

// unit is the fixed-point scale of the token count: one token is a million
// units, so a ratio keeps six decimal digits and the bucket fits an int64.
const unit = 1_000_000

// Config configures a Budget: a plain value that New copies. The zero
// value is the default: ratio 0.1, at most 10 tokens, no time-based
// refill. New rejects the values no field allows.
type Config struct {
	// Ratio is the number of tokens each original call deposits: the share
	// of retries allowed relative to original calls once the initial tokens
	// are spent. Zero means DefaultRatio (0.1); allowed values are in
	// (0, 1000].
	Ratio float64

	// Max caps the tokens in the bucket, which starts full: the burst of
	// retries allowed after a quiet period. Zero means DefaultMax (10);
	// allowed values are in [1, 1e9] (a retry costs one token).
	Max float64

	// MinPerSecond, when positive, refills the bucket with that many tokens
	// per second of wall time, whatever the traffic, so that a low-traffic
	// client whose bucket an outage drained can still retry a little
	// (Finagle's minRetriesPerSec). Zero (the default) disables it, so the
	// bucket moves only with traffic and retries stay a fixed share of it.
	// Allowed values are finite and not negative.
	MinPerSecond float64
}

// Budget is a token bucket for retries: each original call deposits Ratio
// tokens, each retry spends one, and the bucket holds at most Max. When the
// dependency is healthy there are almost no retries, so the bucket stays
// full and costs one atomic load per call; when it is down, retries are held
// to about Ratio of the traffic instead of (attempts-1) times it.
//
// A Budget is safe for concurrent use; it takes no lock. Budgets are per
// process on purpose: a 10 % budget in each of 30 pods is still 10 % in all.
type Budget struct {
	tokens    atomic.Int64 // units
	max       int64        // units
	deposit   int64        // units per original call
	perSecond float64      // tokens per second; 0 = no refill
	refilled  atomic.Int64 // unix nanos of the last time-based refill
	unlimited bool
}

// New returns a full Budget configured by cfg, or an error that Is
// ErrInvalidConfig and names every field cfg holds an invalid value in.
func New(cfg Config) (*Budget, error) {
	var errs []error
	bad := func(field string, v float64, want string) {
		errs = append(errs, &configError{field, v, want})
	}
	ratio := cfg.Ratio
	switch {
	case ratio == 0:
		ratio = DefaultRatio
	case !(ratio > 0 && ratio <= 1000): // also NaN
		bad("Ratio", ratio, "a value in (0, 1000], or zero for the default")
	}
	maxTokens := cfg.Max
	switch {
	case maxTokens == 0:
		maxTokens = DefaultMax
	case !(maxTokens >= 1 && maxTokens <= 1e9):
		bad("Max", maxTokens, "a value in [1, 1e9], or zero for the default")
	}
	if r := cfg.MinPerSecond; !(r >= 0) || math.IsInf(r, 1) {
		bad("MinPerSecond", r, "a finite value of at least 0")
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	b := &Budget{
		max:     int64(math.Round(maxTokens * unit)),
		deposit: max(int64(math.Round(ratio*unit)), 1),
	}
	if cfg.MinPerSecond > 0 {
		b.perSecond = cfg.MinPerSecond
		b.refilled.Store(time.Now().UnixNano())
	}
	b.tokens.Store(b.max)
	return b, nil
}

// Unlimited returns a Budget that grants every retry: for callers that
// want retries bounded only by attempts and deadline. Deposit and TryRetry
// on it cost nothing.
func Unlimited() *Budget {
	return &Budget{unlimited: true}
}

// Deposit records an original call, adding Ratio tokens up to Max.
func (b *Budget) Deposit() {
	if b.unlimited {
		return
	}
	for {
		cur := b.tokens.Load()
		if cur >= b.max { // the common, healthy case: a read, no write
			return
		}
		next := min(cur+b.deposit, b.max)
		if b.tokens.CompareAndSwap(cur, next) {
			return
		}
	}
}

// TryRetry spends one token and reports true, or reports false and leaves
// the bucket unchanged when less than one token is left.
func (b *Budget) TryRetry() bool {
	if b.unlimited {
		return true
	}
	if b.perSecond > 0 {
		b.refill(time.Now())
	}
	for {
		cur := b.tokens.Load()
		if cur < unit {
			return false
		}
		if b.tokens.CompareAndSwap(cur, cur-unit) {
			return true
		}
	}
}

// refill adds the tokens earned by the wall time since the last refill. Only
// the goroutine that advances the refill timestamp adds them.
func (b *Budget) refill(now time.Time) {
	n := now.UnixNano()
	last := b.refilled.Load()
	elapsed := n - last
	if elapsed <= 0 {
		return
	}
	// Earned tokens past a full bucket are worth nothing; capping them
	// before the conversion keeps a huge rate or a long pause from
	// overflowing the int64.
	earned := float64(elapsed) / float64(time.Second) * b.perSecond * unit
	add := b.max
	if earned < float64(b.max) {
		add = int64(earned)
	}
	if add < 1 || !b.refilled.CompareAndSwap(last, n) {
		return
	}
	for {
		cur := b.tokens.Load()
		next := min(cur+add, b.max)
		if next <= cur || b.tokens.CompareAndSwap(cur, next) {
			return
		}
	}
}

// Tokens returns the tokens in the bucket now, for metrics. For an
// Unlimited budget it returns +Inf.
func (b *Budget) Tokens() float64 {
	if b.unlimited {
		return math.Inf(1)
	}
	return float64(b.tokens.Load()) / unit
}

// Max returns the bucket's capacity in tokens (+Inf when Unlimited).
func (b *Budget) Max() float64 {
	if b.unlimited {
		return math.Inf(1)
	}
	return float64(b.max) / unit
}
