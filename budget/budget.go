// Package budget caps retry traffic at a fraction of original traffic.
package budget

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/fleet"
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

// MembersRefresh is how often a Budget with Config.Members asks it again
// for the fleet's live size: at most once a second, on a retry's own
// clock reading, so a costly Members is not read on every retry.
const MembersRefresh = time.Second

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

	// Members, when not nil, makes the burst follow the fleet: each
	// process's bucket holds at most FleetMax / Members.Live() tokens, and
	// starts with that many, so that the processes of a fleet together
	// start an outage with about FleetMax retries instead of Max times
	// their number. It is read at New and then at most once per
	// MembersRefresh, on a retry. Nil, the default, means the process is
	// alone: the bucket holds Max tokens, as without a fleet.
	//
	// Only the burst is divided: the ratio already scales with each
	// process's own traffic, so Ratio of all the calls of a fleet is Ratio
	// of the fleet's traffic whatever its size. The bucket stays in the
	// process rather than in a shared store: a retry never waits on the
	// network, and a fleet whose size is known late (a Members that has
	// learnt nothing yet counts only itself) has, for that while, the
	// burst of a fleet of one per process, never less.
	Members fleet.Members

	// FleetMax is the burst of the whole fleet when Members is set: each
	// process holds FleetMax / Members.Live() tokens, at least 1 (a
	// process must be able to retry once after a quiet period, so a fleet
	// larger than FleetMax has a burst of one retry per process) and at
	// most Max. Zero means Max: the fleet together has the burst a single
	// process would have alone. Allowed values are in [1, 1e9], and only
	// with Members.
	FleetMax float64
}

// Budget is a token bucket for retries: each original call deposits Ratio
// tokens, each retry spends one, and the bucket holds at most Max. When the
// dependency is healthy there are almost no retries, so the bucket stays
// full and costs one atomic load per call; when it is down, retries are held
// to about Ratio of the traffic instead of (attempts-1) times it.
//
// A Budget is safe for concurrent use; it takes no lock. Budgets are per
// process on purpose: a 10 % budget in each of 30 pods is still 10 % in all.
// Only the burst multiplies with the pods, which Config.Members divides.
type Budget struct {
	tokens    atomic.Int64 // units
	max       atomic.Int64 // units; changes only with Members
	deposit   int64        // units per original call
	perSecond float64      // tokens per second; 0 = no refill
	refilled  atomic.Int64 // unix nanos of the last time-based refill
	unlimited bool

	members  fleet.Members // nil: the process alone
	fleetMax float64       // tokens, for the whole fleet
	ownMax   float64       // tokens: Config.Max, the cap of one process's share
	counted  atomic.Int64  // unix nanos of the last Members.Live read
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
	fleetMax := cfg.FleetMax
	switch {
	case fleetMax != 0 && cfg.Members == nil:
		bad("FleetMax", fleetMax, "zero when Members is nil")
	case fleetMax == 0:
		fleetMax = maxTokens
	case !(fleetMax >= 1 && fleetMax <= 1e9):
		bad("FleetMax", fleetMax, "a value in [1, 1e9], or zero for Max")
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	b := &Budget{
		deposit: max(int64(math.Round(ratio*unit)), 1),
		ownMax:  maxTokens,
	}
	now := time.Now()
	if cfg.MinPerSecond > 0 {
		b.perSecond = cfg.MinPerSecond
		b.refilled.Store(now.UnixNano())
	}
	b.max.Store(int64(math.Round(maxTokens * unit)))
	if cfg.Members != nil {
		b.members, b.fleetMax = cfg.Members, fleetMax
		b.max.Store(b.share(cfg.Members.Live()))
		b.counted.Store(now.UnixNano())
	}
	b.tokens.Store(b.max.Load())
	return b, nil
}

// share returns one process's bucket size, in units, in a fleet of live
// processes: FleetMax / live, within [1, Max].
func (b *Budget) share(live int) int64 {
	t := min(max(b.fleetMax/float64(max(live, 1)), 1), b.ownMax)
	return int64(math.Round(t * unit))
}

// follow asks Members for the fleet's size when MembersRefresh has passed
// since it last did, and resizes the bucket: a larger fleet lowers the
// tokens to the new size at once; a smaller one raises only the cap, which
// deposits then fill.
func (b *Budget) follow(now time.Time) {
	n := now.UnixNano()
	last := b.counted.Load()
	if n-last < int64(MembersRefresh) || !b.counted.CompareAndSwap(last, n) {
		return
	}
	size := b.share(b.members.Live())
	if b.max.Swap(size) <= size {
		return
	}
	for {
		cur := b.tokens.Load()
		if cur <= size || b.tokens.CompareAndSwap(cur, size) {
			return
		}
	}
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
		cur, top := b.tokens.Load(), b.max.Load()
		if cur >= top { // the common, healthy case: reads, no write
			return
		}
		next := min(cur+b.deposit, top)
		if b.tokens.CompareAndSwap(cur, next) {
			return
		}
	}
}

// TryRetry spends one token and reports true, or reports false and leaves
// the bucket unchanged when less than one token is left. It reads the clock
// only when MinPerSecond or Members is set.
func (b *Budget) TryRetry() bool {
	if b.unlimited {
		return true
	}
	if b.perSecond > 0 || b.members != nil {
		return b.TryRetryAt(time.Now())
	}
	return b.spend()
}

// TryRetryAt is TryRetry at time now: the time-based refill and the
// refresh of the fleet's size measure from now instead of reading the
// clock.
func (b *Budget) TryRetryAt(now time.Time) bool {
	if b.unlimited {
		return true
	}
	if b.members != nil {
		b.follow(now)
	}
	if b.perSecond > 0 {
		b.refill(now)
	}
	return b.spend()
}

// spend takes one token if there is one.
func (b *Budget) spend() bool {
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
	top := b.max.Load()
	earned := float64(elapsed) / float64(time.Second) * b.perSecond * unit
	add := top
	if earned < float64(top) {
		add = int64(earned)
	}
	if add < 1 || !b.refilled.CompareAndSwap(last, n) {
		return
	}
	for {
		cur := b.tokens.Load()
		next := min(cur+add, top)
		if next <= cur || b.tokens.CompareAndSwap(cur, next) {
			return
		}
	}
}

// Drain empties the bucket: no retry is granted until deposits (or the
// time-based refill) put a token back. A metastability detector's
// actuator (package metastable) drains a budget while the system it
// watches cannot recover under its retries. On an Unlimited budget it
// does nothing.
func (b *Budget) Drain() {
	if b.unlimited {
		return
	}
	b.tokens.Store(0)
	if b.perSecond > 0 {
		b.refilled.Store(time.Now().UnixNano())
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

// Max returns the bucket's capacity in tokens (+Inf when Unlimited): with
// Members, this process's share of FleetMax as last computed.
func (b *Budget) Max() float64 {
	if b.unlimited {
		return math.Inf(1)
	}
	return float64(b.max.Load()) / unit
}
