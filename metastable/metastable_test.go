package metastable_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/metastable"
	"github.com/guardrail-go/guardrail/shed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder keeps the Metastable events.
type recorder struct {
	mu     sync.Mutex
	events []event.Event
}

func (r *recorder) Observe(ctx context.Context, e event.Event) context.Context {
	if e.Kind == event.Metastable {
		r.mu.Lock()
		r.events = append(r.events, e)
		r.mu.Unlock()
	}
	return ctx
}

func (r *recorder) transitions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, e.From+">"+e.To)
	}
	return out
}

// feed sends one window's events: calls calls to dep, ok of them
// successful, each with attempts attempts, timeouts of the attempts ending
// on a timeout.
func feed(d event.Observer, dep string, calls, ok, attempts, timeouts int) {
	ctx := context.Background()
	for i := range calls {
		for a := range attempts {
			d.Observe(ctx, event.Event{Kind: event.AttemptStart, Dependency: dep, Attempt: a + 1})
			if a > 0 {
				d.Observe(ctx, event.Event{Kind: event.Retry, Dependency: dep})
			}
		}
		out := event.OutcomeError
		if i < ok {
			out = event.OutcomeOK
		}
		d.Observe(ctx, event.Event{Kind: event.CallEnd, Dependency: dep, Outcome: out, Attempt: attempts})
	}
	for range timeouts {
		d.Observe(ctx, event.Event{Kind: event.Timeout, Dependency: dep, Phase: event.PhaseAttempt})
	}
}

func newShedder(t *testing.T, limit int) *shed.Shedder {
	t.Helper()
	s, err := shed.New(shed.Config{Name: "front", Limit: limit, RetryAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The whole cycle: an outage (degraded, the dependency down), the
// dependency back with goodput still low and retries high (metastable
// after Hold windows, the actuator on), goodput back (normal after Hold
// windows, the actuator off).
func TestCycle(t *testing.T) {
	b, err := budget.New(budget.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := newShedder(t, 40)
	rec := &recorder{}
	var changes []bool
	d, err := metastable.New(metastable.Config{Name: "db", Observer: rec, Relief: metastable.Relief{
		Act: true, Budgets: []*budget.Budget{b}, Shedders: []*shed.Shedder{s},
		OnChange: func(on bool) { changes = append(changes, on) },
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Unix(0, 0)
	step := func(calls, ok, attempts, timeouts int) metastable.Window {
		feed(d, "db", calls, ok, attempts, timeouts)
		feed(d, "other", 100, 0, 3, 100) // another dependency's calls count for nothing
		now = now.Add(time.Second)
		return d.EvaluateAt(ctx, now)
	}

	if w := step(100, 100, 1, 0); w.State != metastable.Normal || w.Goodput() != 1 {
		t.Fatalf("healthy window: %+v", w)
	}
	// The outage: nothing succeeds, the dependency is down.
	if w := step(100, 0, 3, 0); w.State != metastable.Degraded || w.Healthy {
		t.Fatalf("outage window: %+v; want degraded, not healthy", w)
	}
	// Back, but 10 % goodput at 3 attempts a call and half the attempts
	// timing out: degraded for Hold-1 windows, then metastable.
	for i := range metastable.DefaultHold {
		w := step(100, 10, 3, 150)
		want := metastable.Degraded
		if i == metastable.DefaultHold-1 {
			want = metastable.Metastable
		}
		if w.State != want || !w.Healthy || !w.Symptomatic {
			t.Fatalf("window %d after the outage: %+v; want %v, healthy, symptomatic", i, w, want)
		}
	}
	if !d.Last().Acting || len(changes) != 1 || !changes[0] {
		t.Fatalf("acting %v, OnChange calls %v; want the actuator on once", d.Last().Acting, changes)
	}
	if got := b.Tokens(); got != 0 {
		t.Fatalf("budget holds %v tokens while relieved; want 0", got)
	}
	if st := s.Stats(); st.Limit != 20 {
		t.Fatalf("shedder limit %d while relieved; want 40 cut to 20", st.Limit)
	}
	if ra, ok := s.ReliefRetryAfter(); !ok || ra != metastable.DefaultRetryAfter {
		t.Fatalf("relief Retry-After = %v, %v; want %v", ra, ok, metastable.DefaultRetryAfter)
	}

	// Deposits while relieved are drained again at the next window.
	for range 50 {
		b.Deposit()
	}
	if w := step(100, 95, 1, 0); w.State != metastable.Metastable || b.Tokens() != 0 {
		t.Fatalf("first good window: %+v, tokens %v; want still metastable (hold), budget drained", w, b.Tokens())
	}
	// A window between the thresholds restarts the count, and cuts the
	// shedder again: goodput is not back.
	step(100, 70, 1, 0)
	if st := s.Stats(); st.Limit != 10 {
		t.Fatalf("shedder limit %d after a window that did not recover; want 20 cut again to 10", st.Limit)
	}
	// Hold good windows, then the limit is given back a doubling a
	// window: 10 to 20 at the third, 40 (whole) at the fourth.
	for i := range metastable.DefaultHold + 1 {
		w := step(100, 95, 1, 0)
		if want := i == metastable.DefaultHold; (w.State == metastable.Normal) != want {
			t.Fatalf("good window %d: %+v", i, w)
		}
		if i == metastable.DefaultHold-1 {
			if st := s.Stats(); st.Limit != 20 || !w.Acting {
				t.Fatalf("first easing window: limit %d, acting %v; want 20, acting", st.Limit, w.Acting)
			}
		}
	}
	if d.Last().Acting || len(changes) != 2 || changes[1] {
		t.Fatalf("acting %v, OnChange calls %v; want the actuator off", d.Last().Acting, changes)
	}
	if st := s.Stats(); st.Limit != 40 {
		t.Fatalf("shedder limit %d after relief; want its fixed 40 back", st.Limit)
	}
	if _, ok := s.ReliefRetryAfter(); ok {
		t.Fatal("relief Retry-After still in force after relief")
	}
	want := []string{"normal>degraded", "degraded>metastable", "metastable>normal"}
	if got := rec.transitions(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("transitions %v; want %v", got, want)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if e := rec.events[1]; e.Reason != event.ReasonRelief || !strings.Contains(e.Detail, "goodput 0.10 of 100 calls") || !strings.Contains(e.Detail, "relief on") {
		t.Fatalf("metastable event %+v; want reason relief and the window's numbers", e)
	}
	if e := rec.events[2]; e.Reason != "" || !strings.Contains(e.Detail, "relief off") {
		t.Fatalf("recovery event %+v; want no reason, relief off", e)
	}
}

// Low goodput without the symptoms (a slow dependency, few retries, no
// timeouts) is degraded, never metastable; a window below MinCalls
// changes nothing; without Act nothing is touched.
func TestDegradedWithoutSymptoms(t *testing.T) {
	b, _ := budget.New(budget.Config{})
	d, err := metastable.New(metastable.Config{Name: "db", Hold: 2, Relief: metastable.Relief{Budgets: []*budget.Budget{b}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 5 {
		feed(d, "db", 100, 20, 1, 0)
		if w := d.Evaluate(ctx); w.State != metastable.Degraded || w.Symptomatic {
			t.Fatalf("window %d: %+v; want degraded without symptoms", i, w)
		}
	}
	feed(d, "db", 19, 19, 1, 0)
	if w := d.Evaluate(ctx); w.Judged || w.State != metastable.Degraded {
		t.Fatalf("a window of 19 calls: %+v; want not judged, still degraded", w)
	}
	// Symptoms now, but Act is off: metastable, nothing drained.
	for range 2 {
		feed(d, "db", 100, 20, 3, 0)
		d.Evaluate(ctx)
	}
	if d.State() != metastable.Metastable || d.Last().Acting || b.Tokens() != budget.DefaultMax {
		t.Fatalf("state %v, acting %v, tokens %v; want metastable, reported only", d.State(), d.Last().Acting, b.Tokens())
	}
}

// Healthy decides whether the trigger is over: while it fails, the state
// is degraded however the calls look.
func TestHealthyProbe(t *testing.T) {
	var up bool
	d, err := metastable.New(metastable.Config{Name: "db", Hold: 1, Healthy: func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("probe without a deadline")
		}
		if !up {
			return errors.New("failing over")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	feed(d, "db", 100, 10, 3, 0)
	if w := d.Evaluate(context.Background()); w.State != metastable.Degraded || w.Healthy {
		t.Fatalf("probe failing: %+v; want degraded", w)
	}
	up = true
	feed(d, "db", 100, 10, 3, 0)
	if w := d.Evaluate(context.Background()); w.State != metastable.Metastable {
		t.Fatalf("probe passing: %+v; want metastable", w)
	}
}

// The shedders' queue wait is a symptom: retries and timeouts low, but
// requests waited past QueueWait.
func TestQueueWaitSymptom(t *testing.T) {
	s, err := shed.New(shed.Config{Name: "front", Limit: 1, MaxQueue: 10, MaxQueueWait: time.Minute, QueueTarget: time.Minute, QueueInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	d, err := metastable.New(metastable.Config{Name: "db", Hold: 1, QueueWait: 50 * time.Millisecond, Relief: metastable.Relief{Shedders: []*shed.Shedder{s}}})
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		tok, err := s.Acquire(ctx, shed.Normal)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan shed.Token)
		go func() {
			t2, err := s.Acquire(ctx, shed.Normal)
			if err != nil {
				t.Error(err)
			}
			got <- t2
		}()
		synctest.Wait()
		time.Sleep(200 * time.Millisecond)
		tok.Release()
		(<-got).Release()
	})
	feed(d, "db", 100, 10, 1, 0)
	if w := d.Evaluate(context.Background()); w.QueueWait != 200*time.Millisecond || !w.Symptomatic || w.State != metastable.Metastable {
		t.Fatalf("%+v; want a 200ms mean queue wait, symptomatic, metastable", w)
	}
	feed(d, "db", 100, 10, 1, 0)
	if w := d.Evaluate(context.Background()); w.QueueWait != 0 {
		t.Fatalf("next window: queue wait %v; want 0, the last window's already counted", w.QueueWait)
	}
}

// Run judges once a window and turns the actuator off when its context
// ends; a relieved shedder answers the longer Retry-After meanwhile.
func TestRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newShedder(t, 1)
		d, err := metastable.New(metastable.Config{Name: "db", Hold: 1, Relief: metastable.Relief{Act: true, Shedders: []*shed.Shedder{s}, RetryAfter: 30 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { d.Run(ctx); close(done) }()
		feed(d, "db", 100, 10, 3, 0)
		time.Sleep(metastable.DefaultWindow)
		synctest.Wait()
		if d.State() != metastable.Metastable {
			t.Fatalf("after a window: %v; want metastable", d.State())
		}
		h := s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		tok, _ := s.Acquire(context.Background(), shed.Normal) // the one slot
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "30" {
			t.Fatalf("refusal while relieved: %d, Retry-After %q; want 503, 30", rec.Code, rec.Header().Get("Retry-After"))
		}
		tok.Release()
		cancel()
		<-done
		if _, ok := s.ReliefRetryAfter(); ok {
			t.Fatal("relief still in force after Run returned")
		}
	})
}

func TestInvalidConfig(t *testing.T) {
	_, err := metastable.New(metastable.Config{Window: -1, Hold: -2, Goodput: 1.5, Recovered: 0.2, RetryRatio: -1, Wasted: 2,
		Relief: metastable.Relief{Cut: 1, Budgets: []*budget.Budget{nil}}})
	if !errors.Is(err, metastable.ErrInvalidConfig) {
		t.Fatalf("err = %v; want ErrInvalidConfig", err)
	}
	for _, field := range []string{"Name", "Window", "Hold", "Goodput", "RetryRatio", "Wasted", "Relief.Cut", "Relief.Budgets[0]"} {
		if !strings.Contains(err.Error(), "Config."+field+" is") {
			t.Errorf("error does not name %s:\n%v", field, err)
		}
	}
	if _, err := metastable.New(metastable.Config{Name: "db", Goodput: 0.8, Recovered: 0.7}); err == nil || !strings.Contains(err.Error(), "Config.Recovered is 0.7") {
		t.Fatalf("Recovered below Goodput: %v", err)
	}
}

func TestObserveAllocatesNothing(t *testing.T) {
	d, err := metastable.New(metastable.Config{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e := event.Event{Kind: event.CallEnd, Dependency: "db", Outcome: event.OutcomeOK}
	if n := testing.AllocsPerRun(100, func() { d.Observe(ctx, e) }); n != 0 {
		t.Fatalf("Observe allocates %v times; want 0", n)
	}
}

func BenchmarkObserve(b *testing.B) {
	d, _ := metastable.New(metastable.Config{Name: "db"})
	ctx := context.Background()
	ok := event.Event{Kind: event.CallEnd, Dependency: "db", Outcome: event.OutcomeOK}
	other := event.Event{Kind: event.CallEnd, Dependency: "cache", Outcome: event.OutcomeError}
	b.Run("counted", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				d.Observe(ctx, ok)
			}
		})
	})
	b.Run("other", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			d.Observe(ctx, other)
		}
	})
}

// The Observer and OnChange run without the Detector's lock: they may ask
// it for its state.
func TestCallbacksMayAskState(t *testing.T) {
	var d *metastable.Detector
	var seen []metastable.State
	var acting []bool
	var err error
	d, err = metastable.New(metastable.Config{Name: "db", Hold: 1,
		Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			seen = append(seen, d.State())
			return ctx
		}),
		Relief: metastable.Relief{Act: true, OnChange: func(on bool) { acting = append(acting, d.Last().Acting) }},
	})
	if err != nil {
		t.Fatal(err)
	}
	feed(d, "db", 100, 10, 3, 0)
	d.Evaluate(context.Background())
	if len(seen) != 1 || seen[0] != metastable.Metastable || len(acting) != 1 || !acting[0] {
		t.Fatalf("states seen by the Observer %v, by OnChange %v; want [metastable], [true]", seen, acting)
	}
}
