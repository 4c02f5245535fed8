package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/guardrail-go/guardrail/shed"
	"github.com/platinummonkey/go-concurrency-limits/core"
	"github.com/platinummonkey/go-concurrency-limits/limit"
	"github.com/platinummonkey/go-concurrency-limits/limiter"
	"github.com/platinummonkey/go-concurrency-limits/strategy"
)

// admission is what a limiter hands an admitted request: done frees the
// slot; sample says whether the request's latency should teach an adaptive
// limit (false when the client went away).
type admission interface {
	done(sample bool)
}

// concLimiter is one of the limiters compared, in front of the pool. None
// of them queues: acquire either admits at once or refuses.
type concLimiter interface {
	acquire(ctx context.Context) (admission, bool)
	// limit is the current concurrency limit, or -1 when there is none.
	limit() int
}

// limiterSpec is a parsed -limiters entry.
type limiterSpec struct {
	Name  string // none, fixed, guardrail, failsafe, gradient2, vegas
	Fixed int    // for fixed
}

func (s limiterSpec) String() string {
	if s.Name == "fixed" {
		return "fixed=" + strconv.Itoa(s.Fixed)
	}
	return s.Name
}

// limitLabel is the JSON "limit" key: the number for a fixed limit, else
// "adaptive" (or "none").
func (s limiterSpec) limitLabel() any {
	switch s.Name {
	case "fixed":
		return s.Fixed
	case "none":
		return "none"
	}
	return "adaptive"
}

func parseLimiters(s string) ([]limiterSpec, error) {
	var out []limiterSpec
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if n, ok := strings.CutPrefix(f, "fixed="); ok {
			v, err := strconv.Atoi(n)
			if err != nil || v <= 0 {
				return nil, fmt.Errorf("limiter %q: want fixed=N with N > 0", f)
			}
			out = append(out, limiterSpec{Name: "fixed", Fixed: v})
			continue
		}
		switch f {
		case "none", "guardrail", "failsafe", "gradient2", "vegas":
			out = append(out, limiterSpec{Name: f})
		default:
			return nil, fmt.Errorf("unknown limiter %q (want none, fixed=N, guardrail, failsafe, gradient2, vegas)", f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no limiter given")
	}
	return out, nil
}

// newLimiter builds a fresh limiter, each library with its defaults.
func newLimiter(s limiterSpec) (concLimiter, error) {
	switch s.Name {
	case "none":
		return noLimit{}, nil
	case "fixed":
		return &fixedLimit{max: int64(s.Fixed)}, nil
	case "guardrail":
		sh, err := shed.New(shed.Config{Shares: map[shed.Priority]float64{shed.Normal: 1}})
		if err != nil {
			return nil, err
		}
		return guardrailLimit{sh}, nil
	case "failsafe":
		return failsafeLimit{adaptivelimiter.NewWithDefaults[any]()}, nil
	case "gradient2":
		return newConcLimits(limit.NewDefaultGradient2Limit("gradient2", limit.NoopLimitLogger{}, core.EmptyMetricRegistryInstance))
	case "vegas":
		return newConcLimits(limit.NewDefaultVegasLimit("vegas", limit.NoopLimitLogger{}, core.EmptyMetricRegistryInstance))
	}
	return nil, fmt.Errorf("unknown limiter %q", s.Name)
}

type noLimit struct{}

type noAdmission struct{}

func (noAdmission) done(bool) {}

func (noLimit) acquire(context.Context) (admission, bool) { return noAdmission{}, true }
func (noLimit) limit() int                                { return -1 }

type fixedLimit struct {
	max      int64
	inFlight atomic.Int64
}

type fixedAdmission struct{ l *fixedLimit }

func (a fixedAdmission) done(bool) { a.l.inFlight.Add(-1) }

func (l *fixedLimit) acquire(context.Context) (admission, bool) {
	if l.inFlight.Add(1) > l.max {
		l.inFlight.Add(-1)
		return nil, false
	}
	return fixedAdmission{l}, true
}
func (l *fixedLimit) limit() int { return int(l.max) }

// guardrailLimit is shed with its default adaptive limit, every request
// Normal with a share of 1 so that the whole limit is usable.
type guardrailLimit struct{ s *shed.Shedder }

type guardrailAdmission struct{ t shed.Token }

func (a guardrailAdmission) done(sample bool) {
	if sample {
		a.t.Release()
	} else {
		a.t.Ignore()
	}
}

func (l guardrailLimit) acquire(ctx context.Context) (admission, bool) {
	t, err := l.s.Acquire(ctx, shed.Normal)
	if err != nil {
		return nil, false
	}
	return guardrailAdmission{t}, true
}

func (l guardrailLimit) limit() int {
	_, lim := l.s.Load()
	return lim
}

// failsafeLimit is failsafe-go's adaptive limiter with its defaults, used
// without its optional queue (TryAcquirePermit never waits).
type failsafeLimit struct {
	l adaptivelimiter.AdaptiveLimiter[any]
}

type failsafeAdmission struct{ p adaptivelimiter.Permit }

func (a failsafeAdmission) done(sample bool) {
	if sample {
		a.p.Record()
	} else {
		a.p.Drop()
	}
}

func (l failsafeLimit) acquire(context.Context) (admission, bool) {
	p, ok := l.l.TryAcquirePermit()
	if !ok {
		return nil, false
	}
	return failsafeAdmission{p}, true
}

func (l failsafeLimit) limit() int { return l.l.Limit() }

// concLimits is go-concurrency-limits' DefaultLimiter (the non-blocking
// one) around a limit algorithm, wired as the library's own defaults do:
// the sample window of NewDefaultLimiterWithDefaults (1 s, at least 100
// samples, RTTs under 100 µs ignored) and a SimpleStrategy created from the
// algorithm's initial limit.
type concLimits struct{ l *limiter.DefaultLimiter }

type concLimitsAdmission struct{ l core.Listener }

func (a concLimitsAdmission) done(sample bool) {
	if sample {
		a.l.OnSuccess()
	} else {
		a.l.OnIgnore()
	}
}

func newConcLimits(alg core.Limit) (concLimiter, error) {
	l, err := limiter.NewDefaultLimiterWithFactory(
		alg,
		int64(time.Second), int64(time.Second), // min and max sample window
		int64(100*time.Microsecond), // RTTs below this are not samples
		100,                         // samples per window
		strategy.NewSimpleStrategyFactory(),
		limit.NoopLimitLogger{},
		core.EmptyMetricRegistryInstance,
	)
	if err != nil {
		return nil, err
	}
	return concLimits{l}, nil
}

func (l concLimits) acquire(ctx context.Context) (admission, bool) {
	li, ok := l.l.Acquire(ctx)
	if !ok {
		return nil, false
	}
	return concLimitsAdmission{li}, true
}

func (l concLimits) limit() int { return l.l.EstimatedLimit() }
