package breaker_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/event"
)

// FuzzBreaker runs random configurations (including invalid values) and
// random sequences of calls, results, clock steps and manual overrides, and
// checks the invariants after every step: no panic, rejections that are
// ErrOpen, legal transitions only, never more probes in flight than
// HalfOpenProbes, open times within their bounds, consistent metrics.
func FuzzBreaker(f *testing.F) {
	f.Add(int8(0), 0.0, uint8(1), uint8(0), uint8(0), uint16(0), 0.0, 0.0, []byte{0, 1, 0, 1, 2, 200, 0, 1})
	f.Add(int8(-1), 0.5, uint8(3), uint8(2), uint8(10), uint16(100), 0.2, 2.0, []byte{0, 0, 0, 1, 1, 1, 2, 250, 0, 0, 0, 0, 1, 0})
	f.Add(int8(5), math.NaN(), uint8(2), uint8(5), uint8(0), uint16(5), -1.0, 1.5, []byte{3, 0, 4, 0, 1, 5, 0, 1, 6})
	f.Add(int8(1), 2.0, uint8(0), uint8(0), uint8(4), uint16(1000), math.Inf(1), math.Inf(1), []byte{0, 1, 2, 255, 2, 255, 0, 0, 0})
	f.Fuzz(func(t *testing.T, minReq int8, rate float64, probes, closeAfter, countWindow uint8, slowMs uint16, jitter, backoff float64, ops []byte) {
		cfg := breaker.Config{
			MinRequests:    int(minReq),
			FailureRate:    rate,
			SlowRate:       rate,
			HalfOpenProbes: int(probes % 6),
			CloseAfter:     int(closeAfter % 6),
			CountWindow:    int(countWindow % 20),
			SlowCall:       time.Duration(slowMs) * time.Millisecond,
			OpenFor:        time.Second,
			OpenJitter:     jitter,
			OpenBackoff:    backoff,
			MaxOpenFor:     10 * time.Second,
			Window:         5 * time.Second,
			Buckets:        5,
		}
		wantProbes := int(probes % 6)
		if wantProbes == 0 {
			wantProbes = 1 // the default
		}
		epoch := 0 // counts transitions into half-open
		cfg.Observer = event.ObserverFunc(func(ctx context.Context, tr event.Event) context.Context {
			is := func(rs ...breaker.Reason) bool {
				for _, r := range rs {
					if tr.Reason == string(r) {
						return true
					}
				}
				return false
			}
			closed, open, half := breaker.Closed.String(), breaker.Open.String(), breaker.HalfOpen.String()
			legal := map[[2]string]bool{
				{closed, open}:   is(breaker.ReasonFailureRate, breaker.ReasonSlowRate, breaker.ReasonForcedOpen),
				{open, half}:     is(breaker.ReasonOpenElapsed),
				{half, open}:     is(breaker.ReasonProbeFailed, breaker.ReasonProbeSlow, breaker.ReasonProbeTimeout, breaker.ReasonForcedOpen),
				{half, closed}:   is(breaker.ReasonProbesPassed, breaker.ReasonForcedClosed, breaker.ReasonReset),
				{open, closed}:   is(breaker.ReasonForcedClosed, breaker.ReasonReset),
				{closed, closed}: is(breaker.ReasonForcedClosed, breaker.ReasonReset),
				{open, open}:     is(breaker.ReasonForcedOpen),
			}
			if !legal[[2]string{tr.From, tr.To}] {
				t.Fatalf("illegal transition %v -> %v (%s)", tr.From, tr.To, tr.Reason)
			}
			if tr.To == open && !is(breaker.ReasonForcedOpen) && (tr.Delay < time.Second || tr.Delay > 20*time.Second) {
				t.Fatalf("open for %v, outside [1s, MaxOpenFor*(1+jitter)]", tr.Delay)
			}
			if tr.To == half {
				epoch++
			}
			return ctx
		})
		b, err := breaker.New(cfg)
		if err != nil {
			if !errors.Is(err, breaker.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), "breaker: Config.") {
				t.Fatalf("New(%+v) = %v; want a named field and ErrInvalidConfig", cfg, err)
			}
			return
		}

		type permit struct {
			p     breaker.Permit
			epoch int
		}
		var out []permit
		now := time.Now()
		next := func() byte {
			if len(ops) == 0 {
				return 0
			}
			c := ops[0]
			ops = ops[1:]
			return c
		}
		for len(ops) > 0 {
			switch next() % 7 {
			case 0:
				closed := b.State() == breaker.Closed
				p, err := b.AllowAt(now)
				switch {
				case err == nil:
					out = append(out, permit{p, epoch})
				case !errors.Is(err, breaker.ErrOpen):
					t.Fatalf("rejection %v does not wrap ErrOpen", err)
				case closed:
					t.Fatalf("closed breaker rejected: %v", err)
				}
			case 1:
				if len(out) > 0 {
					i := int(next()) % len(out)
					o := breaker.Outcome(next() % 3)
					out[i].p.DoneAt(o, time.Duration(next())*10*time.Millisecond, now)
					out = append(out[:i], out[i+1:]...)
				}
			case 2:
				now = now.Add(time.Duration(next()) * 50 * time.Millisecond)
			case 3:
				b.ForceOpen()
			case 4:
				b.ForceClosed()
			case 5:
				b.Reset()
			case 6:
			}
			m := b.Metrics()
			if m.Probes < 0 || m.Probes > wantProbes {
				t.Fatalf("%d probes in flight, limit %d", m.Probes, wantProbes)
			}
			if m.State == breaker.HalfOpen {
				n := 0
				for _, p := range out {
					if p.p.Probe() && p.epoch == epoch {
						n++
					}
				}
				if n > wantProbes {
					t.Fatalf("%d probe permits out in this half-open period, limit %d", n, wantProbes)
				}
			}
			if m.Failures > m.Calls || m.Slow > m.Calls || m.FailureRate < 0 || m.FailureRate > 1 {
				t.Fatalf("inconsistent metrics %+v", m)
			}
		}
	})
}
