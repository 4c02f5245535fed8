package slogobs_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/slogobs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a slog.Handler that keeps the records, flattened to
// "LEVEL msg k=v k=v" lines (groups as g.k=v).
type recorder struct {
	level slog.Level
	mu    sync.Mutex
	lines []string
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler           { return r }
func (r *recorder) WithGroup(string) slog.Handler                { return r }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	var add func(prefix string, a slog.Attr)
	add = func(prefix string, a slog.Attr) {
		if a.Equal(slog.Attr{}) {
			return
		}
		if a.Value.Kind() == slog.KindGroup {
			for _, g := range a.Value.Group() {
				add(prefix+a.Key+".", g)
			}
			return
		}
		fmt.Fprintf(&b, " %s%s=%v", prefix, a.Key, a.Value)
	}
	rec.Attrs(func(a slog.Attr) bool { add("", a); return true })
	r.mu.Lock()
	r.lines = append(r.lines, b.String())
	r.mu.Unlock()
	return nil
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lines
	r.lines = nil
	return l
}

func expect(t *testing.T, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestBreakerTransition(t *testing.T) {
	rec := &recorder{level: slog.LevelInfo}
	o := newObserver(t, slogobs.Config{
		Logger: slog.New(rec),
		BreakerConfig: func(dep string) slog.Value {
			return slog.GroupValue(slog.Float64("failure_rate", 0.5), slog.Int("min_requests", 20), slog.Duration("open", 30*time.Second))
		},
	})
	defer o.Close()
	ctx := context.Background()
	o.Observe(ctx, event.Event{Kind: event.BreakerTransition, Dependency: "payments", From: "closed", To: "open",
		Reason: "failure_rate", Detail: "failure rate 0.55 of 20 calls >= 0.5", Delay: 33 * time.Second})
	o.Observe(ctx, event.Event{Kind: event.BreakerTransition, Dependency: "payments", From: "open", To: "half_open", Reason: "open_elapsed"})
	expect(t, rec.take(),
		"WARN guardrail: breaker transition dependency=payments from=closed to=open reason=failure_rate cause=failure rate 0.55 of 20 calls >= 0.5 open_for=33s config.failure_rate=0.5 config.min_requests=20 config.open=30s",
		"INFO guardrail: breaker transition dependency=payments from=open to=half_open reason=open_elapsed cause=open_elapsed config.failure_rate=0.5 config.min_requests=20 config.open=30s",
	)
}

// TestShedBurst: a thousand requests shed over five seconds make a start
// record, one summary at the end of the interval, and an end record after
// a quiet interval; not a thousand lines.
func TestShedBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		o := newObserver(t, slogobs.Config{Logger: slog.New(rec), Interval: 10 * time.Second})
		ctx := context.Background()
		shed := func(i int) event.Event {
			e := event.Event{Kind: event.Shed, Dependency: "api", Operation: "POST /orders",
				Priority: "sheddable", Reason: event.ReasonCapacity, InFlight: 100, Limit: 100}
			if i%4 == 0 {
				e.Priority, e.Reason, e.InFlight = "normal", event.ReasonQueueFull, 101
			}
			return e
		}
		for i := range 1000 {
			o.Observe(ctx, shed(i))
			time.Sleep(5 * time.Millisecond)
		}
		expect(t, rec.take(),
			"WARN guardrail: requests shed dependency=api burst=start operation=POST /orders priority=normal reason=queue_full in_flight=101 limit=100 summary_every=10s")

		time.Sleep(5 * time.Second) // t = 10 s: the first interval ends
		synctest.Wait()
		expect(t, rec.take(),
			"WARN guardrail: requests shed dependency=api burst=ongoing count=999 window=10s total=1000 burst_duration=10s by_reason.capacity=750 by_reason.queue_full=249 by_priority.normal=249 by_priority.sheddable=750 max_in_flight=101 limit=100")

		time.Sleep(10 * time.Second) // a quiet interval: the burst is over
		synctest.Wait()
		expect(t, rec.take(),
			"INFO guardrail: requests shed dependency=api burst=end count=0 window=10s total=1000 burst_duration=20s")

		// A lone rejection later: a start record and nothing more.
		time.Sleep(time.Minute)
		o.Observe(ctx, shed(1))
		time.Sleep(time.Minute)
		synctest.Wait()
		expect(t, rec.take(),
			"WARN guardrail: requests shed dependency=api burst=start operation=POST /orders priority=sheddable reason=capacity in_flight=100 limit=100 summary_every=10s")
		o.Close()
	})
}

// TestBurstsPerDependencyAndKind: bursts are counted apart per dependency
// and kind; Close writes what is pending, stops the timers, and later
// rejections are not logged.
func TestBurstsPerDependencyAndKind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		o := newObserver(t, slogobs.Config{Logger: slog.New(rec)})
		ctx := context.Background()
		for range 3 {
			o.Observe(ctx, event.Event{Kind: event.BreakerReject, Dependency: "a", Delay: time.Second})
			o.Observe(ctx, event.Event{Kind: event.BreakerReject, Dependency: "b", Delay: time.Second})
			o.Observe(ctx, event.Event{Kind: event.BudgetExhausted, Dependency: "a", Tokens: 0.5})
			o.Observe(ctx, event.Event{Kind: event.Idempotency, Dependency: "a", Reason: event.ReasonStoreError, Err: errors.New("redis: connection refused")})
		}
		time.Sleep(time.Second)
		o.Close()
		o.Observe(ctx, event.Event{Kind: event.BreakerReject, Dependency: "a"})
		expect(t, rec.take(),
			"WARN guardrail: calls rejected by breaker dependency=a burst=start operation= retry_in=1s summary_every=10s",
			"WARN guardrail: calls rejected by breaker dependency=b burst=start operation= retry_in=1s summary_every=10s",
			"WARN guardrail: retries refused by budget dependency=a burst=start operation= tokens=0.5 summary_every=10s",
			"ERROR guardrail: idempotency store failing dependency=a burst=start operation= error=redis: connection refused summary_every=10s",
			"WARN guardrail: retries refused by budget dependency=a burst=ongoing count=2 window=1s total=3 burst_duration=1s tokens=0.5",
			"WARN guardrail: calls rejected by breaker dependency=a burst=ongoing count=2 window=1s total=3 burst_duration=1s",
			"WARN guardrail: calls rejected by breaker dependency=b burst=ongoing count=2 window=1s total=3 burst_duration=1s",
			"ERROR guardrail: idempotency store failing dependency=a burst=ongoing count=2 window=1s total=3 burst_duration=1s by_reason.store_error=2 last_error=redis: connection refused",
		)
		time.Sleep(time.Hour)
		synctest.Wait()
		if got := rec.take(); len(got) != 0 {
			t.Errorf("records after Close: %q", got)
		}
	})
}

// TestDebugRecords: per-call records only when Debug is enabled.
func TestDebugRecords(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		synctest.Test(t, func(t *testing.T) {
			rec := &recorder{level: level}
			o := newObserver(t, slogobs.Config{Logger: slog.New(rec)})
			defer o.Close()
			p := &guardrail.Policy{Name: "search", Idempotent: true, Retry: guardrail.Retry{MaxAttempts: 2, Backoff: backoff.Constant(time.Millisecond)}, Observer: o}
			_, _ = guardrail.Do(event.WithOperation(context.Background(), "Find"), p, func(context.Context) (int, error) {
				return 0, guardrail.Transient(errors.New("503"))
			})
			if level == slog.LevelInfo {
				expect(t, rec.take())
				return
			}
			expect(t, rec.take(),
				"DEBUG guardrail: retry dependency=search operation=Find attempt=1 delay=1ms reason=backoff error=503",
				"DEBUG guardrail: retry refused dependency=search operation=Find attempt=2 reason=attempts error=503",
				"DEBUG guardrail: call failed dependency=search operation=Find outcome=error attempts=2 duration=1ms error=503",
			)
		})
	}
}

// TestConcurrent: rejections from many goroutines while intervals end (for
// the race detector); every rejection is counted once.
func TestConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		o := newObserver(t, slogobs.Config{Logger: slog.New(rec), Interval: time.Second})
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 500 {
					o.Observe(context.Background(), event.Event{Kind: event.Shed, Dependency: fmt.Sprint(g % 2), Reason: event.ReasonCapacity})
					if i%50 == 0 {
						time.Sleep(300 * time.Millisecond)
					}
				}
			})
		}
		wg.Wait()
		o.Close()
		total := 0
		for _, l := range rec.take() {
			if strings.Contains(l, "burst=start") {
				total++
				continue
			}
			_, rest, _ := strings.Cut(l, "count=")
			var n int
			fmt.Sscan(strings.Fields(rest)[0], &n)
			total += n
		}
		if total != 2000 {
			t.Errorf("counted %d rejections, want 2000", total)
		}
	})
}

// TestPolicyBreakerTrip: a real breaker tripping under Do logs one record
// per transition, not one per failed or rejected call, and the rejections
// as one burst.
func TestPolicyBreakerTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		o := newObserver(t, slogobs.Config{Logger: slog.New(rec)})
		p := &guardrail.Policy{
			Name: "ledger", Retry: guardrail.Retry{
				MaxAttempts: 1,
			},
			Observer: o,
			Breaker:  must(breaker.New(breaker.Config{Name: "ledger", MinRequests: 4, OpenFor: 5 * time.Second, OpenJitter: -1, Observer: o})),
		}
		for range 10 {
			_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
				return 0, guardrail.Transient(errors.New("503"))
			})
		}
		o.Close()
		expect(t, rec.take(),
			"WARN guardrail: breaker transition dependency=ledger from=closed to=open reason=failure_rate cause=failure rate 1 of 4 calls >= 0.5 open_for=5s",
			`WARN guardrail: calls rejected by breaker dependency=ledger burst=start operation= retry_in=5s error=breaker "ledger": open until 2000-01-01T00:00:05Z summary_every=10s`,
			`WARN guardrail: calls rejected by breaker dependency=ledger burst=ongoing count=5 window=0s total=6 burst_duration=0s last_error=breaker "ledger": open until 2000-01-01T00:00:05Z`,
		)
	})
}

// newObserver returns slogobs.New(cfg), failing the test on an error.
func newObserver(t testing.TB, cfg slogobs.Config) *slogobs.Observer {
	t.Helper()
	o, err := slogobs.New(cfg)
	if err != nil {
		t.Fatalf("slogobs.New: %v", err)
	}
	return o
}

// TestInvalidConfig: a negative Interval is refused, naming the field, and
// the error Is ErrInvalidConfig.
func TestInvalidConfig(t *testing.T) {
	o, err := slogobs.New(slogobs.Config{Interval: -time.Second})
	if o != nil || !errors.Is(err, slogobs.ErrInvalidConfig) {
		t.Fatalf("New = %v, %v; want nil and ErrInvalidConfig", o, err)
	}
	if got, want := err.Error(), "slogobs: Config.Interval is -1s; want 0 (the default, 10s) or more"; got != want {
		t.Errorf("error = %q, want %q", got, want)
	}
}

// must returns v, for constructors given a configuration the test knows is
// valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestIdempotencyOutcomeUnknown: unknown outcomes (a handler that panicked
// or took the connection, whose key now answers 500) are a burst of their
// own at Warn, apart from store errors of the same dependency; other
// idempotency decisions are Debug records only.
func TestIdempotencyOutcomeUnknown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		o := newObserver(t, slogobs.Config{Logger: slog.New(rec)})
		ctx := context.Background()
		for range 2 {
			o.Observe(ctx, event.Event{Kind: event.Idempotency, Dependency: "api", Operation: "POST /orders", Reason: event.ReasonOutcomeUnknown})
			o.Observe(ctx, event.Event{Kind: event.Idempotency, Dependency: "api", Operation: "POST /orders", Reason: event.ReasonStoreError})
			o.Observe(ctx, event.Event{Kind: event.Idempotency, Dependency: "api", Operation: "POST /orders", Reason: event.ReasonReplayed})
		}
		o.Close()
		expect(t, rec.take(),
			"WARN guardrail: idempotency outcome unknown dependency=api burst=start operation=POST /orders summary_every=10s",
			"ERROR guardrail: idempotency store failing dependency=api burst=start operation=POST /orders summary_every=10s",
			"WARN guardrail: idempotency outcome unknown dependency=api burst=ongoing count=1 window=0s total=2 burst_duration=0s by_reason.outcome_unknown=1",
			"ERROR guardrail: idempotency store failing dependency=api burst=ongoing count=1 window=0s total=2 burst_duration=0s by_reason.store_error=1",
		)
	})
}
