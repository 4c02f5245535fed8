package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/guardrail-go/guardrail/backoff"
)

// The backoff strategies of the jitter experiment, a retry storm, by
// the names NewStrategy and JitterConfig.Strategies accept.
const (
	StrategyNone         = "none"         // backoff.Exponential: min(cap, base*2^retry)
	StrategyPlus         = "plus"         // ExponentialPlus: the same + u*PlusJitter
	StrategyEqual        = "equal"        // backoff.EqualJitter
	StrategyFull         = "full"         // backoff.FullJitter
	StrategyDecorrelated = "decorrelated" // backoff.Decorrelated
)

// DefaultPlusJitter is the additive jitter of a common retry helper: an
// exponential delay plus 0..100 ms, too little to spread a herd.
const DefaultPlusJitter = 100 * time.Millisecond

// Strategies returns the names of the jitter experiment's strategies in the
// order of its table.
func Strategies() []string {
	return []string{StrategyNone, StrategyPlus, StrategyEqual, StrategyFull, StrategyDecorrelated}
}

// NewStrategy returns the backoff strategy called name, with the given base
// and cap (zero means the backoff package's defaults) and, for StrategyPlus,
// the additive jitter plus (zero means DefaultPlusJitter), together with the
// label of its row in the table.
func NewStrategy(name string, base, cap, plus time.Duration) (s backoff.Strategy, label string, err error) {
	if base <= 0 {
		base = backoff.DefaultBase
	}
	if cap <= 0 {
		cap = backoff.DefaultCap
	}
	switch name {
	case StrategyNone:
		return backoff.Exponential(base, cap), "no jitter", nil
	case StrategyPlus:
		plus = orDefault(plus, DefaultPlusJitter)
		return ExponentialPlus(base, cap, plus), "+0.." + plus.String(), nil
	case StrategyEqual:
		return backoff.EqualJitter(base, cap), "equal jitter", nil
	case StrategyFull:
		return backoff.FullJitter(base, cap), "full jitter", nil
	case StrategyDecorrelated:
		return backoff.Decorrelated(base, cap), "decorrelated", nil
	}
	return nil, "", badConfig("unknown strategy %q (want one of %s)", name, strings.Join(Strategies(), ", "))
}

// JitterConfig configures the jitter experiment: one scenario run once per
// backoff strategy. The zero value is the retry storm of the defaults
// (1000 clients failing together) with all five strategies. Jitter only reads it, so one may serve concurrent runs.
type JitterConfig struct {
	// Config is the scenario. Its Backoff is ignored: each strategy
	// replaces it. Every strategy runs with the same Seed, so they are
	// compared on the same draws.
	Config

	// Base and Cap configure every strategy. Zero means 100 ms and 10 s.
	Base, Cap time.Duration

	// PlusJitter is the additive jitter of StrategyPlus. Zero means
	// DefaultPlusJitter.
	PlusJitter time.Duration

	// Strategies lists the rows by name, in order. Empty means Strategies().
	Strategies []string
}

// Row is one line of the jitter experiment's table. Like Result, it is safe
// to read concurrently but not to mutate.
type Row struct {
	Strategy string // the strategy's name, such as StrategyFull
	Label    string // the row's label, such as "full jitter"
	Result   Result
}

// Jitter runs the jitter experiment: cfg's scenario once per strategy. It
// returns an error wrapping ErrConfig for an unknown strategy or an invalid
// scenario, and ctx.Err() if ctx ends first.
//
// Read the table with the slot in mind. A jitter spreads a herd only over
// its window: when the window is no wider than a slot, the herd still lands
// in one slot. With the default parameters (base = slot = 100 ms) the first
// retry of equal and full jitter falls in [0, 100 ms), inside slot 0 whose
// capacity the first calls already used, so their retry peak is at least
// Clients-Capacity and those retries are wasted; the +0..100ms helper's
// first retry lands in slot 1 instead. Full jitter overtakes it on retry
// peak, total calls and completion once Base spans several slots; with
// finer slots at the same rate it does less work and finishes sooner, but
// the helper's 100 ms then spans slots too and keeps a lower peak.
// Decorrelated jitter, which never waits less than Base, avoids slot 0.
func Jitter(ctx context.Context, cfg JitterConfig) ([]Row, error) {
	names := cfg.Strategies
	if len(names) == 0 {
		names = Strategies()
	}
	rows := make([]Row, 0, len(names))
	for _, name := range names {
		s, label, err := NewStrategy(name, cfg.Base, cfg.Cap, cfg.PlusJitter)
		if err != nil {
			return nil, err
		}
		c := cfg.Config
		c.Backoff = s
		res, err := Run(ctx, c)
		if err != nil {
			return nil, err
		}
		rows = append(rows, Row{Strategy: name, Label: label, Result: res})
	}
	return rows, nil
}

// labelWidth is the width of the label column in the lab's table.
const labelWidth = 15

// String formats r as a line of the lab's table:
//
//	no jitter       total_calls= 5500 retry_peak/slot= 900 gave_up=   0 all_done_at=32.7s
func (r Row) String() string { return r.line(labelWidth) }

func (r Row) line(width int) string {
	return fmt.Sprintf("%-*s total_calls=%5d retry_peak/slot=%4d gave_up=%4d all_done_at=%.1fs",
		width, r.Label, r.Result.TotalCalls, r.Result.RetryPeak, r.Result.GaveUp, r.Result.AllDoneAt.Seconds())
}

// WriteTable writes rows as the lab's table, one line each, widening the
// label column when a label is longer than the default width.
func WriteTable(w io.Writer, rows []Row) error {
	width := labelWidth
	for _, r := range rows {
		width = max(width, len(r.Label))
	}
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(r.line(width))
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Record is a Row in the lab's JSON shape: durations in milliseconds,
// rounded to 0.1 ms. It is a plain value, safe to copy and share.
type Record struct {
	Experiment       string  `json:"experiment"` // always "jitter"
	Row              string  `json:"row"`        // the row's label
	Strategy         string  `json:"strategy"`
	Clients          int     `json:"clients"`
	TotalCalls       int     `json:"total_calls"`
	Retries          int     `json:"retries"`
	RetryPeakPerSlot int     `json:"retry_peak_per_slot"`
	CallPeakPerSlot  int     `json:"call_peak_per_slot"`
	Succeeded        int     `json:"succeeded"`
	GaveUp           int     `json:"gave_up"`
	GaveUpAttempts   int     `json:"gave_up_attempts"`
	GaveUpDeadline   int     `json:"gave_up_deadline"`
	GaveUpBudget     int     `json:"gave_up_budget"`
	AllDoneAtMS      float64 `json:"all_done_at_ms"`
}

// Record returns r in the lab's JSON shape.
func (r Row) Record() Record {
	res := r.Result
	return Record{
		Experiment:       "jitter",
		Row:              r.Label,
		Strategy:         r.Strategy,
		Clients:          res.Clients,
		TotalCalls:       res.TotalCalls,
		Retries:          res.Retries,
		RetryPeakPerSlot: res.RetryPeak,
		CallPeakPerSlot:  res.CallPeak,
		Succeeded:        res.Succeeded,
		GaveUp:           res.GaveUp,
		GaveUpAttempts:   res.GaveUpAttempts,
		GaveUpDeadline:   res.GaveUpDeadline,
		GaveUpBudget:     res.GaveUpBudget,
		AllDoneAtMS:      math.Round(float64(res.AllDoneAt)/float64(time.Millisecond)*10) / 10,
	}
}

// WriteJSON writes one JSON object per row and per line (JSON Lines).
func WriteJSON(w io.Writer, rows []Row) error {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(r.Record()); err != nil {
			return err
		}
	}
	return nil
}

// ExponentialPlus waits min(cap, base*2^retry) + u*jitter: exponential
// backoff with a small additive jitter, a common helper that does not
// spread a herd. At retry 3 with base 100 ms the window is 800..900 ms, so
// clients that failed together still retry within 100 ms of each other.
// The jitter experiment compares it with the strategies of package
// backoff; it is not offered there because no caller should choose it.
func ExponentialPlus(base, cap, jitter time.Duration) backoff.Strategy {
	return exponentialPlus{backoff.Exponential(base, cap), max(jitter, 0)}
}

type exponentialPlus struct {
	exp    backoff.Strategy
	jitter time.Duration
}

func (s exponentialPlus) Delay(retry int, prev time.Duration, u float64) time.Duration {
	if !(u > 0) { // also NaN
		u = 0
	}
	u = min(u, math.Nextafter(1, 0))
	return s.exp.Delay(retry, prev, 0) + time.Duration(float64(s.jitter)*u)
}
