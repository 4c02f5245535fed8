// Package prom exports guardrail's events as Prometheus metrics.
package prom

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"unicode/utf8"

	"github.com/guardrail-go/guardrail/event"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/extra/prom/internal/series"
	"github.com/guardrail-go/guardrail/shed"
)

// ErrInvalidConfig is the error every invalid Config field Is. The error
// New returns names the field, what it held and what is allowed.
var ErrInvalidConfig = errors.New("prom: invalid config")

// Config configures a Collector. The zero Config is valid. A Config is a
// plain value: New reads it once and keeps its own copy of what it needs,
// so changing it afterwards has no effect.
type Config struct {
	// ConstLabels are added to every series, for labels that are fixed for
	// the process, such as {"region": "eu-west-1"}. Nil means none. A name
	// must be a valid Prometheus label name (letters, digits and
	// underscores, not starting with a digit or "__"), must not be one of
	// guardrail's labels (dependency, key, operation, outcome, reason,
	// phase, priority, state, from, to) or "le", and a value must be valid
	// UTF-8.
	ConstLabels prometheus.Labels

	// MaxLabelValues caps the distinct values of each label (dependency,
	// operation, outcome, ...): the first MaxLabelValues values seen are
	// kept and every later one is exported as "other", so a raw URL path
	// or user ID passed as an operation cannot grow the series without
	// bound. Values longer than 128 bytes or not valid UTF-8 are always
	// "other". Zero means 100, as in extra/otel; a negative value is
	// invalid.
	MaxLabelValues int

	// DurationBuckets are the histogram buckets, in seconds, of call,
	// attempt and queue durations: finite and strictly increasing. Empty
	// means 1 ms to 30 s.
	DurationBuckets []float64

	// RemainingBuckets are the histogram buckets, in seconds, of the time
	// left on the deadline when an attempt starts: finite and strictly
	// increasing. Empty means 10 ms to 60 s.
	RemainingBuckets []float64
}

// validate returns one error per invalid field of cfg, joined, or nil.
func (cfg *Config) validate() error {
	errs := []error{
		series.CheckMaxValues("prom", ErrInvalidConfig, cfg.MaxLabelValues),
		series.CheckBuckets("prom", ErrInvalidConfig, "Config.DurationBuckets", cfg.DurationBuckets),
		series.CheckBuckets("prom", ErrInvalidConfig, "Config.RemainingBuckets", cfg.RemainingBuckets),
	}
	reserved := map[string]bool{"le": true}
	for _, d := range series.All {
		for _, l := range d.Labels {
			reserved[l] = true
		}
	}
	names := make([]string, 0, len(cfg.ConstLabels))
	for name := range cfg.ConstLabels {
		names = append(names, name)
	}
	sort.Strings(names) // report the same field on every run
	for _, name := range names {
		invalid := func(value, want string) error {
			return &series.ConfigError{Pkg: "prom", Field: fmt.Sprintf("Config.ConstLabels[%q]", name), Value: value, Want: want, Sentinel: ErrInvalidConfig}
		}
		switch {
		case !labelName(name):
			errs = append(errs, invalid("set", "label names of letters, digits and underscores, not starting with a digit or \"__\""))
		case reserved[name]:
			errs = append(errs, invalid("set", "a name guardrail's series do not use"))
		case !utf8.ValidString(cfg.ConstLabels[name]):
			errs = append(errs, invalid(fmt.Sprintf("%q", cfg.ConstLabels[name]), "a valid UTF-8 value"))
		}
	}
	return errors.Join(errs...)
}

// labelName reports whether s is a label name every Prometheus version
// accepts and that is not reserved for Prometheus' own use.
func labelName(s string) bool {
	if s == "" || len(s) >= 2 && s[:2] == "__" {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z':
		case '0' <= r && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Collector turns guardrail events into the guardrail_* series listed in
// docs/metrics.md. It is both an event.Observer (set it as
// Policy.Observer, or combine it with event.Join) and a
// prometheus.Collector (register it once). Gauges of state that events
// report only when it changes (breaker state, budget tokens, shedder load)
// are read at scrape time from the components given to the Watch methods,
// so they are right from the first scrape.
//
// Label children are resolved once per distinct combination of label
// values and cached, so observing an event takes one lock-free hash table
// lookup and allocates nothing; a successful call (four events) costs two
// lookups, a counter increment and a histogram observation each.
//
// A Collector is safe for concurrent use.
type Collector struct {
	folders *series.Folders

	calls       *prometheus.CounterVec
	callDur     *prometheus.HistogramVec
	attempts    *prometheus.CounterVec
	attemptDur  *prometheus.HistogramVec
	remaining   *prometheus.HistogramVec
	retries     *prometheus.CounterVec
	refused     *prometheus.CounterVec
	hedges      *prometheus.CounterVec
	reloads     *prometheus.CounterVec
	retryOK     *prometheus.CounterVec
	retryFailed *prometheus.CounterVec
	timeouts    *prometheus.CounterVec
	transitions *prometheus.CounterVec
	rejections  *prometheus.CounterVec
	probes      *prometheus.CounterVec
	bulkhead    *prometheus.CounterVec
	shed        *prometheus.CounterVec
	admitted    *prometheus.CounterVec
	queueWait   *prometheus.HistogramVec
	amp         *prometheus.HistogramVec
	sharedStore *prometheus.CounterVec
	idempotency *prometheus.CounterVec
	hints       *prometheus.CounterVec
	metastable  *prometheus.CounterVec

	vecs []prometheus.Collector

	stateDesc, tokensDesc, inFlightDesc, limitDesc *prometheus.Desc

	// Per label combination caches of the hot series.
	callC        *series.Cache[*callSeries]
	attemptC     *series.Cache[*attemptSeries]
	remainingC   *series.Cache[prometheus.Observer]
	retriesC     *series.Cache[prometheus.Counter]
	refusedC     *series.Cache[prometheus.Counter]
	hedgesC      *series.Cache[prometheus.Counter]
	timeoutsC    *series.Cache[prometheus.Counter]
	transC       *series.Cache[prometheus.Counter]
	rejectC      *series.Cache[prometheus.Counter]
	probeC       *series.Cache[prometheus.Counter]
	bulkheadC    *series.Cache[prometheus.Counter]
	shedC        *series.Cache[prometheus.Counter]
	admitC       *series.Cache[prometheus.Counter]
	queueC       *series.Cache[prometheus.Observer]
	ampC         *series.Cache[prometheus.Observer]
	sharedStoreC *series.Cache[prometheus.Counter]
	idempotentC  *series.Cache[prometheus.Counter]
	hintsC       *series.Cache[prometheus.Counter]
	metastableC  *series.Cache[prometheus.Counter]

	gauges *series.Gauges
}

type callSeries struct {
	count prometheus.Counter
	dur   prometheus.Observer
	// retried is retry success (outcome ok) or retry exhausted, made on
	// first use so that outcomes never retried export no zero series.
	retried  atomic.Pointer[prometheus.Counter]
	newRetry func() prometheus.Counter
}

func (s *callSeries) retry() prometheus.Counter {
	if p := s.retried.Load(); p != nil {
		return *p
	}
	c := s.newRetry()
	s.retried.CompareAndSwap(nil, &c)
	return *s.retried.Load()
}

type attemptSeries struct {
	count prometheus.Counter
	dur   prometheus.Observer
}

// New returns a Collector configured by cfg, or an error that Is
// ErrInvalidConfig and names every invalid field. Register the
// Collector with a prometheus.Registerer before the first scrape.
func New(cfg Config) (*Collector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	durBuckets := cfg.DurationBuckets
	if len(durBuckets) == 0 {
		durBuckets = series.DurationBuckets
	}
	remBuckets := cfg.RemainingBuckets
	if len(remBuckets) == 0 {
		remBuckets = series.RemainingBuckets
	}
	c := &Collector{folders: series.NewFolders(cfg.MaxLabelValues)}
	cl := cfg.ConstLabels
	counter := func(d *series.Def) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: d.Name, Help: d.Help, ConstLabels: cl}, d.Labels)
		c.vecs = append(c.vecs, v)
		return v
	}
	histogram := func(d *series.Def, buckets []float64) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: d.Name, Help: d.Help, ConstLabels: cl, Buckets: buckets}, d.Labels)
		c.vecs = append(c.vecs, v)
		return v
	}
	gauge := func(d *series.Def) *prometheus.Desc {
		return prometheus.NewDesc(d.Name, d.Help, d.Labels, cl)
	}
	c.calls = counter(series.Calls)
	c.callDur = histogram(series.CallDuration, durBuckets)
	c.attempts = counter(series.Attempts)
	c.attemptDur = histogram(series.AttemptDuration, durBuckets)
	c.remaining = histogram(series.DeadlineRemaining, remBuckets)
	c.retries = counter(series.Retries)
	c.refused = counter(series.RetriesRefused)
	c.hedges = counter(series.Hedges)
	c.reloads = counter(series.ConfigReloads)
	c.retryOK = counter(series.RetrySuccess)
	c.retryFailed = counter(series.RetryExhausted)
	c.timeouts = counter(series.Timeouts)
	c.transitions = counter(series.BreakerTransitions)
	c.rejections = counter(series.BreakerRejections)
	c.probes = counter(series.BreakerProbes)
	c.bulkhead = counter(series.BulkheadRejections)
	c.shed = counter(series.Shed)
	c.admitted = counter(series.Admitted)
	c.queueWait = histogram(series.QueueWait, durBuckets)
	c.amp = histogram(series.Amplification, series.AmplificationBuckets)
	c.sharedStore = counter(series.SharedStore)
	c.idempotency = counter(series.Idempotency)
	c.hints = counter(series.FleetHints)
	c.metastable = counter(series.MetastableTransitions)
	c.stateDesc = gauge(series.BreakerState)
	c.tokensDesc = gauge(series.BudgetTokens)
	c.inFlightDesc = gauge(series.InFlight)
	c.limitDesc = gauge(series.Limit)

	fs := c.folders
	c.gauges = series.NewGauges(fs)
	c.callC = series.NewCache(series.Calls, fs, func(lv []string) *callSeries {
		s := &callSeries{
			count: c.calls.WithLabelValues(lv...),
			dur:   c.callDur.WithLabelValues(lv[0], lv[1]),
		}
		dep, op, outcome := lv[0], lv[1], lv[2]
		if outcome == event.OutcomeOK {
			s.newRetry = func() prometheus.Counter { return c.retryOK.WithLabelValues(dep, op) }
		} else {
			s.newRetry = func() prometheus.Counter { return c.retryFailed.WithLabelValues(dep, op, outcome) }
		}
		return s
	})
	c.attemptC = series.NewCache(series.Attempts, fs, func(lv []string) *attemptSeries {
		return &attemptSeries{count: c.attempts.WithLabelValues(lv...), dur: c.attemptDur.WithLabelValues(lv...)}
	})
	c.remainingC = series.NewCache(series.DeadlineRemaining, fs, func(lv []string) prometheus.Observer {
		return c.remaining.WithLabelValues(lv...)
	})
	counterCache := func(d *series.Def, v *prometheus.CounterVec) *series.Cache[prometheus.Counter] {
		return series.NewCache(d, fs, func(lv []string) prometheus.Counter { return v.WithLabelValues(lv...) })
	}
	c.retriesC = counterCache(series.Retries, c.retries)
	c.refusedC = counterCache(series.RetriesRefused, c.refused)
	c.hedgesC = counterCache(series.Hedges, c.hedges)
	c.timeoutsC = counterCache(series.Timeouts, c.timeouts)
	c.transC = counterCache(series.BreakerTransitions, c.transitions)
	c.rejectC = counterCache(series.BreakerRejections, c.rejections)
	c.probeC = counterCache(series.BreakerProbes, c.probes)
	c.bulkheadC = counterCache(series.BulkheadRejections, c.bulkhead)
	c.shedC = counterCache(series.Shed, c.shed)
	c.admitC = counterCache(series.Admitted, c.admitted)
	c.idempotentC = counterCache(series.Idempotency, c.idempotency)
	c.hintsC = counterCache(series.FleetHints, c.hints)
	c.metastableC = counterCache(series.MetastableTransitions, c.metastable)
	c.queueC = series.NewCache(series.QueueWait, fs, func(lv []string) prometheus.Observer {
		return c.queueWait.WithLabelValues(lv...)
	})
	c.sharedStoreC = counterCache(series.SharedStore, c.sharedStore)
	c.ampC = series.NewCache(series.Amplification, fs, func(lv []string) prometheus.Observer {
		return c.amp.WithLabelValues(lv...)
	})
	return c, nil
}

// Observe records e. It implements event.Observer and returns ctx
// unchanged.
func (c *Collector) Observe(ctx context.Context, e event.Event) context.Context {
	dep, op := e.Dependency, e.Operation
	switch e.Kind {
	case event.AttemptStart:
		if e.Remaining >= 0 {
			c.remainingC.Get(dep, op, "", "").Observe(e.Remaining.Seconds())
		}
	case event.AttemptEnd:
		s := c.attemptC.Get(dep, op, e.Outcome, "")
		s.count.Inc()
		s.dur.Observe(e.Duration.Seconds())
	case event.CallEnd:
		s := c.callC.Get(dep, op, e.Outcome, "")
		s.count.Inc()
		s.dur.Observe(e.Duration.Seconds())
		if e.Attempt > 1 {
			s.retry().Inc()
		}
	case event.Retry:
		c.retriesC.Get(dep, op, e.Reason, "").Inc()
	case event.RetryRefused:
		c.refusedC.Get(dep, op, e.Reason, "").Inc()
	case event.Hedge:
		c.hedgesC.Get(dep, op, "sent", "").Inc()
	case event.HedgeRefused:
		c.hedgesC.Get(dep, op, e.Reason, "").Inc()
	case event.ConfigReload:
		// Rare (one per reload), so no cache; two values at most.
		outcome := event.OutcomeError
		if e.Outcome == event.OutcomeOK {
			outcome = event.OutcomeOK
		}
		c.reloads.WithLabelValues(outcome).Inc()
	case event.BudgetExhausted:
		c.gauges.Observe(&e)
	case event.Timeout:
		c.timeoutsC.Get(dep, op, e.Phase, "").Inc()
	case event.BreakerTransition:
		c.transC.Get(dep, e.From, e.To, e.Reason).Inc()
		c.gauges.Observe(&e)
	case event.BreakerReject:
		c.rejectC.Get(dep, op, "", "").Inc()
	case event.BreakerProbe:
		c.probeC.Get(dep, op, "", "").Inc()
	case event.BulkheadReject:
		c.bulkheadC.Get(dep, op, e.Reason, "").Inc()
	case event.Shed:
		c.shedC.Get(dep, op, e.Priority, e.Reason).Inc()
		c.gauges.Observe(&e)
	case event.Admit:
		c.admitC.Get(dep, op, e.Priority, "").Inc()
		c.queueC.Get(dep, e.Priority, "", "").Observe(e.Duration.Seconds())
		c.gauges.Observe(&e)
	case event.Idempotency:
		c.idempotentC.Get(dep, op, e.Reason, "").Inc()
	case event.Amplification:
		c.ampC.Get(dep, "", "", "").Observe(float64(e.Amplification))
	case event.SharedStore:
		c.sharedStoreC.Get(dep, e.Reason, e.Outcome, "").Inc()
	case event.FleetHint:
		c.hintsC.Get(dep, e.Reason, "", "").Inc()
	case event.Metastable:
		c.metastableC.Get(dep, e.From, e.To, e.Reason).Inc()
	}
	return ctx
}

// WatchBudget exports the tokens of b, a retry budget of dependency, read
// at every scrape.
func (c *Collector) WatchBudget(dependency string, b *budget.Budget) {
	c.gauges.WatchBudget(dependency, b)
}

// WatchPolicy watches what p uses, under p.Name: its retry budget and
// its breaker (Policy.Breaker, or the one the policy made), so both are
// exported from the first collection, before any call.
func (c *Collector) WatchPolicy(p *guardrail.Policy) {
	c.gauges.WatchPolicy(p)
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vecs {
		v.Describe(ch)
	}
	ch <- c.stateDesc
	ch <- c.tokensDesc
	ch <- c.inFlightDesc
	ch <- c.limitDesc
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.vecs {
		v.Collect(ch)
	}
	c.gauges.Collect(
		func(dep, key, state string, n float64) {
			ch <- prometheus.MustNewConstMetric(c.stateDesc, prometheus.GaugeValue, n, dep, key, state)
		},
		func(dep string, n float64) {
			ch <- prometheus.MustNewConstMetric(c.tokensDesc, prometheus.GaugeValue, n, dep)
		},
		func(dep string, inFlight, limit float64) {
			ch <- prometheus.MustNewConstMetric(c.inFlightDesc, prometheus.GaugeValue, inFlight, dep)
			ch <- prometheus.MustNewConstMetric(c.limitDesc, prometheus.GaugeValue, limit, dep)
		},
	)
}

// Source is a set of breakers and retry budgets that changes while the
// program runs, read at every collection: *config.Registry is one, whose
// reloads replace the breakers and budgets of the dependencies a policy
// file configures. RangeBreakers calls yield for each breaker in use with
// the dependency its calls name and its key (empty for a dependency's
// only breaker), and RangeBudgets for each dependency's retry budget,
// both until yield returns false. Both must be safe for concurrent use.
type Source interface {
	RangeBreakers(yield func(dependency, key string, b *breaker.Breaker) bool)
	RangeBudgets(yield func(dependency string, b *budget.Budget) bool)
}

// WatchSource reads the breakers and budgets of s at every collection,
// from the first one on: a breaker is exported with its dependency and key
// from the moment s holds it, before any transition, and a budget's tokens
// before any refusal. What s no longer holds (a breaker or budget a reload
// replaced) disappears from the next collection. A dependency s reports
// takes its breaker state and budget tokens from s alone, not from events
// or the other Watch methods, so one breaker is one set of series; leave
// the policies and groups of s unwatched otherwise. Watching s again is a
// no-op.
//
// For a policy file:
//
//	reg, err := config.Load("policy.yaml", config.Options{Observer: metrics})
//	...
//	metrics.WatchSource(reg)
func (c *Collector) WatchSource(s Source) { c.gauges.WatchSource(s) }

// WatchShedder reports the in-flight count and limit of s, a load shedder
// whose events name dependency (its Config.Name), at every collection, so
// the gauges are right from the first one and fall back to zero when the
// traffic stops (events report the load only when a request arrives).
func (c *Collector) WatchShedder(dependency string, s *shed.Shedder) {
	c.gauges.WatchShedder(dependency, s)
}

// WatchBreaker reports the state of b under dependency at every
// collection, from the first one on, with an empty key label. A watched
// dependency's gauge ignores transition events, which only count
// transitions. Watching another breaker under the same dependency adds it:
// past the label cap, guardrail_breaker_state counts the breakers in each
// state. For a breaker.Group use WatchBreakerGroup, which labels each
// breaker with its key.
func (c *Collector) WatchBreaker(dependency string, b *breaker.Breaker) {
	c.gauges.WatchBreaker(dependency, b)
}

// WatchBreakerGroup reports the state of every breaker g holds at every
// collection, under the dependency its calls name, with the breaker's
// group key in the key label. Pass the name the calls report: an HTTP
// client's guardhttp Config.Name, whose transport splits that dependency by
// host (or by its Config.Key). For a client without a name, whose calls
// name each key as a dependency of its own, pass "": each breaker is then
// exported under its key as the dependency, with an empty key label.
//
// A dependency watched this way takes no breaker state from transition
// events, so one breaker is one series. Breakers the group drops
// disappear from the next collection. Past the label cap, keys fold to
// "other", whose gauge counts the breakers in each state.
func (c *Collector) WatchBreakerGroup(dependency string, g *breaker.Group) {
	c.gauges.WatchBreakerGroup(dependency, g)
}
