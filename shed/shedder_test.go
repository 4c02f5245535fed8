package shed_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/shed"
)

// fill acquires priority p until refused and returns the tokens admitted
// and the refusal.
func fill(t *testing.T, s *shed.Shedder, p shed.Priority, retry bool) ([]shed.Token, error) {
	t.Helper()
	var toks []shed.Token
	for range 1000 {
		acquire := s.Acquire
		if retry {
			acquire = s.AcquireRetry
		}
		tok, err := acquire(context.Background(), p)
		if err != nil {
			return toks, err
		}
		toks = append(toks, tok)
	}
	t.Fatal("never refused")
	return nil, nil
}

func releaseAll(toks []shed.Token) {
	for _, tok := range toks {
		tok.Release()
	}
}

func TestSharesByPriority(t *testing.T) {
	// Limit 20 and the default shares 50/70/85/95/100 %.
	for _, c := range []struct {
		p    shed.Priority
		want int
	}{
		{shed.Sheddable, 10},
		{shed.Low, 14},
		{shed.Normal, 17},
		{shed.High, 19},
		{shed.Critical, 20},
		{0, 17},   // invalid: Normal
		{200, 17}, // invalid: Normal
	} {
		t.Run(c.p.String(), func(t *testing.T) {
			s := mustNew(t, shed.Config{Limit: 20})
			toks, err := fill(t, s, c.p, false)
			defer releaseAll(toks)
			if got := len(toks); got != c.want {
				t.Errorf("admitted %d, want %d", got, c.want)
			}
			var e *shed.Error
			if !errors.Is(err, shed.ErrShed) || !errors.As(err, &e) || e.Reason != event.ReasonCapacity {
				t.Fatalf("err = %v, want a capacity *shed.Error that Is ErrShed", err)
			}
			want := c.p
			if _, ok := shed.ParsePriority(c.p.String()); !ok {
				want = shed.Normal
			}
			if e.Priority != want {
				t.Errorf("error priority %v, want %v", e.Priority, want)
			}
		})
	}
}

func TestCriticalGetsInWhenLowerPrioritiesAreFull(t *testing.T) {
	s := mustNew(t, shed.Config{Limit: 20})
	normal, _ := fill(t, s, shed.Normal, false)
	sheddable, _ := fill(t, s, shed.Sheddable, false)
	critical, _ := fill(t, s, shed.Critical, false)
	if len(normal) != 17 || len(sheddable) != 0 || len(critical) != 3 {
		t.Errorf("admitted normal %d, sheddable %d, critical %d; want 17, 0, 3", len(normal), len(sheddable), len(critical))
	}
	releaseAll(normal)
	releaseAll(critical)
	st := s.Stats()
	if st.InFlight != 0 || st.Admitted != 20 || st.AdmittedByPriority[shed.Critical] != 3 ||
		st.ShedByPriority[shed.Sheddable] != 1 || st.Shed != 3 || st.Limit != 20 {
		t.Errorf("stats = %+v", st)
	}
}

func TestRetriesAreJudgedOnePriorityLowerUnderPressure(t *testing.T) {
	s := mustNew(t, shed.Config{Limit: 20})
	// 14 in flight: over the 50 % pressure mark, at Low's share (70 %).
	toks, _ := fill(t, s, shed.Low, false)
	defer releaseAll(toks)
	if _, err := s.AcquireRetry(context.Background(), shed.Normal); !isReason(err, event.ReasonCapacity) {
		t.Errorf("Normal retry at 14/20: err = %v, want shed for capacity (judged as Low)", err)
	}
	tok, err := s.Acquire(context.Background(), shed.Normal)
	if err != nil {
		t.Fatalf("Normal original at 14/20: %v, want admitted", err)
	}
	tok.Release()
	tok, err = s.AcquireRetry(context.Background(), shed.High)
	if err != nil {
		t.Fatalf("High retry at 14/20: %v, want admitted (judged as Normal)", err)
	}
	tok.Release()
}

func TestRetryBudgetUnderPressure(t *testing.T) {
	s := mustNew(t, shed.Config{Limit: 100, RetryRatio: 0.5, RetryBurst: 3})
	// Below pressure (50 in flight), retries need no token.
	var toks []shed.Token
	defer func() { releaseAll(toks) }()
	for range 50 {
		tok, err := s.AcquireRetry(context.Background(), shed.Critical)
		if err != nil {
			t.Fatalf("retry below pressure: %v", err)
		}
		toks = append(toks, tok)
	}
	// Under pressure: the 3 tokens of the burst, then refused.
	more, err := fill(t, s, shed.Critical, true)
	toks = append(toks, more...)
	if len(more) != 3 || !isReason(err, event.ReasonRetryRatio) {
		t.Fatalf("retries under pressure: admitted %d, err %v; want 3 then shed for retry", len(more), err)
	}
	// Two admitted originals at ratio 0.5 earn one retry.
	for range 2 {
		tok, err := s.Acquire(context.Background(), shed.Critical)
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, tok)
	}
	more, _ = fill(t, s, shed.Critical, true)
	toks = append(toks, more...)
	if len(more) != 1 {
		t.Errorf("after 2 originals: %d retries admitted, want 1", len(more))
	}
	if st := s.Stats(); st.AdmittedRetries != 54 || st.ShedByReason[event.ReasonRetryRatio] != 2 {
		t.Errorf("stats: %d retries admitted, %d shed; want 54, 2", st.AdmittedRetries, st.ShedByReason[event.ReasonRetryRatio])
	}
}

func TestRetryAwarenessOff(t *testing.T) {
	s := mustNew(t, shed.Config{Limit: 10, RetryRatio: -1})
	toks, _ := fill(t, s, shed.Critical, true)
	defer releaseAll(toks)
	if len(toks) != 10 {
		t.Errorf("admitted %d retries, want 10: retries count as originals", len(toks))
	}
}

func TestExpiredContext(t *testing.T) {
	s := mustNew(t, shed.Config{Limit: 10})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Acquire(ctx, shed.Critical)
	if !isReason(err, event.ReasonExpired) || !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want shed as expired, wrapping context.Canceled", err)
	}
	if st := s.Stats(); st.InFlight != 0 || st.ShedByReason[event.ReasonExpired] != 1 {
		t.Errorf("stats = %+v", st)
	}
}

func TestZeroTokenIsHarmless(t *testing.T) {
	var tok shed.Token
	tok.Release()
	tok.Ignore()
}

func TestObserverEvents(t *testing.T) {
	var events []event.Event
	obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		events = append(events, e)
		return ctx
	})
	s := mustNew(t, shed.Config{Name: "api", Limit: 2, Observer: obs})
	ctx := event.WithOperation(context.Background(), "GET /x")
	tok, _ := s.Acquire(ctx, shed.Sheddable)
	s.Acquire(ctx, shed.Sheddable)
	tok.Release()
	want := []event.Event{
		{Kind: event.Admit, Dependency: "api", Operation: "GET /x", Priority: "sheddable", InFlight: 1, Limit: 2},
		{Kind: event.Shed, Dependency: "api", Operation: "GET /x", Priority: "sheddable", Reason: event.ReasonCapacity, InFlight: 1, Limit: 2},
	}
	if len(events) != len(want) {
		t.Fatalf("got %d events, want %d: %+v", len(events), len(want), events)
	}
	for i := range want {
		if events[i] != want[i] {
			t.Errorf("event %d = %+v, want %+v", i, events[i], want[i])
		}
	}
}

func TestErrorMessage(t *testing.T) {
	s := mustNew(t, shed.Config{Limit: 1})
	tok, err := s.Acquire(context.Background(), shed.Sheddable)
	if err != nil {
		t.Fatalf("first sheddable on an idle server: %v", err)
	}
	defer tok.Release()
	_, err = s.Acquire(context.Background(), shed.Sheddable)
	if got, want := err.Error(), "shed: request shed: capacity (priority sheddable)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestHeaderPriorityOf(t *testing.T) {
	for _, c := range []struct {
		value string
		max   shed.Priority
		want  shed.Priority
	}{
		{"", 0, shed.Normal},
		{"critical", 0, shed.Normal}, // escalation capped at the default Normal
		{"Low", 0, shed.Low},
		{" sheddable ", 0, shed.Sheddable},
		{"HIGH", shed.Critical, shed.High},
		{"critical", shed.High, shed.High},
		{"garbage", shed.Critical, shed.Normal},
		{"2", shed.Critical, shed.Normal},
		{"normal", shed.Low, shed.Low}, // the cap applies to every request
	} {
		h := http.Header{}
		if c.value != "" {
			h.Set(shed.HeaderPriority, c.value)
		}
		if got := shed.HeaderPriorityOf(h, c.max); got != c.want {
			t.Errorf("HeaderPriorityOf(%q, max %v) = %v, want %v", c.value, c.max, got, c.want)
		}
	}
}

func TestParseRetryAttempt(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want bool
	}{
		{"1", 1, true}, {"0", 0, true}, {" 3 ", 3, true}, {"999999999", 999999999, true},
		{"", 0, false}, {"-1", 0, false}, {"+1", 0, false}, {"1.5", 0, false}, {"abc", 0, false},
		{"1234567890", 0, false}, {"0x10", 0, false},
	} {
		n, ok := shed.ParseRetryAttempt(c.in)
		if n != c.n || ok != c.want {
			t.Errorf("ParseRetryAttempt(%q) = %d, %v; want %d, %v", c.in, n, ok, c.n, c.want)
		}
	}
}

func TestPriorityString(t *testing.T) {
	for p, want := range map[shed.Priority]string{
		shed.Critical: "critical", shed.High: "high", shed.Normal: "normal", shed.Low: "low",
		shed.Sheddable: "sheddable", 0: "priority(0)", 9: "priority(9)",
	} {
		if got := p.String(); got != want {
			t.Errorf("Priority(%d).String() = %q, want %q", p, got, want)
		}
		if q, ok := shed.ParsePriority(want); ok != (p >= shed.Sheddable && p <= shed.Critical) || (ok && q != p) {
			t.Errorf("ParsePriority(%q) = %v, %v", want, q, ok)
		}
	}
}

func isReason(err error, reason string) bool {
	var e *shed.Error
	return errors.Is(err, shed.ErrShed) && errors.As(err, &e) && e.Reason == reason
}

func TestLoad(t *testing.T) {
	s := mustNew(t, shed.Config{Name: "checkout", Limit: 4, Shares: map[shed.Priority]float64{shed.Normal: 1}})
	tok, err := s.Acquire(context.Background(), shed.Normal)
	if err != nil {
		t.Fatal(err)
	}
	if in, limit := s.Load(); in != 1 || limit != 4 {
		t.Fatalf("Load = %d, %d; want 1, 4", in, limit)
	}
	tok.Release()
	if in, _ := s.Load(); in != 0 {
		t.Fatalf("after release: in flight %d", in)
	}
}

// New refuses the values that mean nothing, naming the field, instead of
// replacing them with a default.
func TestNewRejectsInvalidConfig(t *testing.T) {
	nan := math.NaN()
	for _, tt := range []struct {
		cfg  shed.Config
		want string
	}{
		{shed.Config{Limit: -1}, "shed: Config.Limit is -1; want 0 (adaptive) or more"},
		{shed.Config{MaxQueue: -5}, "shed: Config.MaxQueue is -5; want 0 (no queue) or more"},
		{shed.Config{RetryBurst: -1}, "shed: Config.RetryBurst is -1"},
		{shed.Config{RetryRatio: nan}, "shed: Config.RetryRatio is NaN"},
		{shed.Config{RetryPressure: 1.5}, "shed: Config.RetryPressure is 1.5; want a value in (0, 1], or 0 for the default 0.5"},
		{shed.Config{RetryPressure: -0.1}, "shed: Config.RetryPressure is -0.1"},
		{shed.Config{QueueInterval: -time.Second}, "shed: Config.QueueInterval is -1s"},
		{shed.Config{MaxQueueWait: -1}, "shed: Config.MaxQueueWait is -1ns"},
		{shed.Config{QueueTarget: -1}, "shed: Config.QueueTarget is -1ns"},
		{shed.Config{RetryAfter: -time.Second}, "shed: Config.RetryAfter is -1s"},
		{shed.Config{MaxHeaderPriority: 9}, "shed: Config.MaxHeaderPriority is priority(9); want 0 (Normal) or Sheddable..Critical"},
		{shed.Config{Shares: map[shed.Priority]float64{shed.Low: 1.2}}, "shed: Config.Shares[low] is 1.2; want a value in (0, 1], or 0 for the default"},
		{shed.Config{Shares: map[shed.Priority]float64{shed.Low: -0.5}}, "shed: Config.Shares[low] is -0.5"},
		{shed.Config{Shares: map[shed.Priority]float64{7: 0.5}}, "shed: Config.Shares has an entry for priority(7); want Sheddable..Critical"},
		{shed.Config{Adaptive: shed.Adaptive{InitialLimit: -1}}, "shed: Config.Adaptive.InitialLimit is -1"},
		{shed.Config{Adaptive: shed.Adaptive{MinLimit: -1}}, "shed: Config.Adaptive.MinLimit is -1"},
		{shed.Config{Adaptive: shed.Adaptive{MaxLimit: -1}}, "shed: Config.Adaptive.MaxLimit is -1"},
		{shed.Config{Adaptive: shed.Adaptive{Window: -1}}, "shed: Config.Adaptive.Window is -1ns"},
		{shed.Config{Adaptive: shed.Adaptive{Percentile: 2}}, "shed: Config.Adaptive.Percentile is 2; want a value in (0, 1]"},
		{shed.Config{Adaptive: shed.Adaptive{Buffer: -1}}, "shed: Config.Adaptive.Buffer is -1; want 0 (the default 0.1) or more"},
		{shed.Config{Adaptive: shed.Adaptive{MinRTTInterval: -1}}, "shed: Config.Adaptive.MinRTTInterval is -1ns"},
		{shed.Config{Adaptive: shed.Adaptive{MinRTTSamples: -1}}, "shed: Config.Adaptive.MinRTTSamples is -1"},
		{shed.Config{Adaptive: shed.Adaptive{Smoothing: nan}}, "shed: Config.Adaptive.Smoothing is NaN"},
		{shed.Config{Adaptive: shed.Adaptive{MinLimit: 2000}}, "shed: Config.Adaptive.MaxLimit is 0 (1000 in force); want at least Adaptive.MinLimit's 2000"},
	} {
		s, err := shed.New(tt.cfg)
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) || s != nil || !errors.Is(err, shed.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, %v; want nil and an error starting %q", tt.cfg, s, err, tt.want)
		}
	}
	// Every invalid field is named, not only the first; each Is ErrInvalidConfig.
	for _, tt := range []struct {
		cfg  shed.Config
		want []string
	}{
		{shed.Config{Limit: -1, RetryAfter: -time.Second}, []string{"shed: Config.Limit is -1;", "shed: Config.RetryAfter is -1s;"}},
		{shed.Config{MaxQueue: -1, Shares: map[shed.Priority]float64{shed.Low: 2, shed.High: -1}, Adaptive: shed.Adaptive{Window: -1}},
			[]string{"Config.MaxQueue is -1;", "Config.Shares[low] is 2;", "Config.Shares[high] is -1;", "Config.Adaptive.Window is -1ns;"}},
	} {
		_, err := shed.New(tt.cfg)
		if !errors.Is(err, shed.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v; want ErrInvalidConfig", tt.cfg, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("New(%+v): %q does not name %q", tt.cfg, err, w)
			}
		}
		if n := len(err.(interface{ Unwrap() []error }).Unwrap()); n != len(tt.want) {
			t.Errorf("New(%+v): %d errors, want %d: %v", tt.cfg, n, len(tt.want), err)
		}
	}
	for _, cfg := range []shed.Config{
		{},
		{RetryRatio: -1},
		{Limit: 1, MaxQueue: 1, Shares: map[shed.Priority]float64{shed.Normal: 1, shed.Low: 0}},
		{MaxHeaderPriority: shed.Critical, RetryPressure: 1, Adaptive: shed.Adaptive{MinLimit: 5, MaxLimit: 5, Percentile: 1, Smoothing: 1}},
	} {
		if _, err := shed.New(cfg); err != nil {
			t.Errorf("New(%+v) = %v; want it valid", cfg, err)
		}
	}
}
