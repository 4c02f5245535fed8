package fleet_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/fleet"
)

// noLeaks fails the test if a goroutine it started outlives it. (Per test,
// not in a TestMain: the package's other tests may have their own.)
func noLeaks(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// newHints is fleet.NewHints for configurations the test knows are valid;
// the Hints is closed when the test ends.
func newHints(t *testing.T, cfg fleet.HintsConfig) *fleet.Hints {
	t.Helper()
	h, err := fleet.NewHints(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	<-h.Subscribed()
	return h
}

// A pause one process was asked for reaches the others, which hold their
// calls back until it ends, and then forget it.
func TestPauseReachesPeers(t *testing.T) {
	noLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		bus := new(fleet.MemoryBus)
		cfg := fleet.HintsConfig{Bus: bus, Dependencies: []string{"pay"}}
		a, b := newHints(t, cfg), newHints(t, cfg)
		now := time.Now()
		a.RetryAfter("pay", 2*time.Second, now)
		if until, ok := a.Paused("pay", now); !ok || !until.Equal(now.Add(2*time.Second)) {
			t.Fatalf("publisher: Paused = %v, %v; want its own pause at once", until, ok)
		}
		synctest.Wait()
		until, ok := b.Paused("pay", now)
		if !ok || !until.Equal(now.Add(2*time.Second)) {
			t.Fatalf("peer: Paused = %v, %v; want until %v", until, ok, now.Add(2*time.Second))
		}
		if _, ok := b.Paused("other", now); ok {
			t.Fatal("a dependency no hint named is paused")
		}
		if got := a.Stats(); got.Published != 1 || got.Applied != 0 {
			t.Fatalf("publisher stats %+v: want 1 published, its own echo not applied", got)
		}
		if got := b.Stats(); got.Applied != 1 {
			t.Fatalf("peer stats %+v: want 1 applied", got)
		}
		time.Sleep(2 * time.Second)
		for _, h := range []*fleet.Hints{a, b} {
			if _, ok := h.Paused("pay", time.Now()); ok {
				t.Fatal("still paused once the pause ended")
			}
		}
	})
}

// No hint pauses for longer than MaxPause, whatever it asks.
func TestPauseIsCapped(t *testing.T) {
	noLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		bus := new(fleet.MemoryBus)
		cfg := fleet.HintsConfig{Bus: bus, Dependencies: []string{"pay"}, MaxPause: 5 * time.Second}
		a, b := newHints(t, cfg), newHints(t, cfg)
		now := time.Now()
		a.RetryAfter("pay", time.Hour, now)
		// A peer with a larger cap, or a clock far ahead.
		bus.Publish(context.Background(), fleet.Hint{Dependency: "pay", Kind: fleet.HintBreakerOpen, At: now.Add(time.Hour), For: time.Hour, Origin: "peer"})
		synctest.Wait()
		for name, h := range map[string]*fleet.Hints{"publisher": a, "peer": b} {
			if until, ok := h.Paused("pay", now); !ok || until.After(now.Add(5*time.Second)) {
				t.Fatalf("%s: Paused = %v, %v; want paused no later than %v", name, until, ok, now.Add(5*time.Second))
			}
		}
	})
}

// A hint's pause ends at At+For when that comes before For after receipt:
// a hint delayed on the way is shortened, an expired one ignored.
func TestLateHintsAreShortenedOrIgnored(t *testing.T) {
	noLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		bus := new(fleet.MemoryBus)
		h := newHints(t, fleet.HintsConfig{Bus: bus, Dependencies: []string{"pay", "ads"}})
		now := time.Now()
		bus.Publish(context.Background(), fleet.Hint{Dependency: "pay", Kind: fleet.HintPause, At: now.Add(-time.Second), For: 3 * time.Second, Origin: "peer"})
		bus.Publish(context.Background(), fleet.Hint{Dependency: "ads", Kind: fleet.HintPause, At: now.Add(-time.Minute), For: 3 * time.Second, Origin: "peer"})
		synctest.Wait()
		if until, ok := h.Paused("pay", now); !ok || !until.Equal(now.Add(2*time.Second)) {
			t.Fatalf("delayed hint: Paused = %v, %v; want until %v", until, ok, now.Add(2*time.Second))
		}
		if _, ok := h.Paused("ads", now); ok {
			t.Fatal("an expired hint paused the dependency")
		}
		if got := h.Stats(); got.Applied != 1 || got.Rejected != 1 {
			t.Fatalf("stats %+v, want 1 applied, 1 rejected", got)
		}
	})
}

// Hints about names this process does not accept, of unknown kinds or
// without a duration are dropped, and hold no state.
func TestInvalidHintsAreRejected(t *testing.T) {
	noLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		bus := new(fleet.MemoryBus)
		var rejected []event.Event
		h := newHints(t, fleet.HintsConfig{Bus: bus, Dependencies: []string{"pay"}, Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			if e.Reason == event.ReasonHintRejected {
				rejected = append(rejected, e)
			}
			return ctx
		})})
		for _, hint := range []fleet.Hint{
			{Dependency: "evil", Kind: fleet.HintPause, For: time.Second},
			{Dependency: "pay", Kind: 0, For: time.Second},
			{Dependency: "pay", Kind: 9, For: time.Second},
			{Dependency: "pay", Kind: fleet.HintPause, For: 0},
			{Dependency: "pay", Kind: fleet.HintPause, For: -time.Second},
		} {
			hint.Origin = "peer"
			bus.Publish(context.Background(), hint)
		}
		synctest.Wait()
		if _, ok := h.Paused("pay", time.Now()); ok {
			t.Fatal("an invalid hint paused the dependency")
		}
		if _, ok := h.Paused("evil", time.Now()); ok {
			t.Fatal("a hint about an unknown name paused it")
		}
		if got := h.Stats(); got.Rejected != 5 || got.Applied != 0 {
			t.Fatalf("stats %+v, want 5 rejected", got)
		}
		if len(rejected) != 5 || rejected[0].Dependency != "" || rejected[1].Dependency != "pay" {
			t.Fatalf("rejected events %+v: want 5, the unknown name not as a Dependency", rejected)
		}
	})
}

// A pause already known, from this process or a peer, is not published
// again: a fleet whose every call meets the same Retry-After publishes
// it about once per process, not once per call.
func TestKnownPausesAreNotPublishedAgain(t *testing.T) {
	noLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		bus := new(fleet.MemoryBus)
		cfg := fleet.HintsConfig{Bus: bus, Dependencies: []string{"pay"}}
		a, b := newHints(t, cfg), newHints(t, cfg)
		now := time.Now()
		for range 100 {
			a.RetryAfter("pay", 10*time.Second, now)
		}
		synctest.Wait()
		b.RetryAfter("pay", 10*time.Second, now.Add(500*time.Millisecond)) // within a tenth
		synctest.Wait()
		if sa, sb := a.Stats(), b.Stats(); sa.Published != 1 || sa.Suppressed != 99 || sb.Published != 0 || sb.Suppressed != 1 {
			t.Fatalf("stats %+v and %+v: want one hint published in all", sa, sb)
		}
		b.RetryAfter("pay", 10*time.Second, now.Add(2*time.Second)) // extends it by a fifth
		synctest.Wait()
		if got := b.Stats().Published; got != 1 {
			t.Fatalf("a longer pause was not published: %d", got)
		}
	})
}

// stuckBus never answers: Publish blocks until its context ends and
// Subscribe fails, as a bus that cannot be reached does.
type stuckBus struct{ subscribes atomic.Int64 }

func (b *stuckBus) Publish(ctx context.Context, h fleet.Hint) error {
	<-ctx.Done()
	return ctx.Err()
}

func (b *stuckBus) Subscribe(ctx context.Context, deliver func(fleet.Hint)) (func(), error) {
	b.subscribes.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// A lost bus never blocks the caller: hints beyond the queue are dropped
// and counted, publishes time out, subscribing is tried again and again,
// and the local pause still holds this process's own calls back.
func TestLostBusNeverBlocks(t *testing.T) {
	noLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		bus := new(stuckBus)
		var failed, full atomic.Int64
		h, err := fleet.NewHints(fleet.HintsConfig{
			Bus: bus, Dependencies: []string{"pay"}, MaxQueued: 2, PublishTimeout: 100 * time.Millisecond,
			Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
				if e.Reason == event.ReasonHintPublishFailed && errors.Is(e.Err, context.DeadlineExceeded) {
					failed.Add(1)
				}
				if e.Reason == event.ReasonHintQueueFull {
					full.Add(1)
				}
				return ctx
			}),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		start := time.Now()
		for i := range 10 {
			now := start.Add(time.Duration(i) * time.Minute) // each one a new pause
			h.RetryAfter("pay", time.Second, now)
			if _, ok := h.Paused("pay", now); !ok {
				t.Fatal("the local pause does not need the bus")
			}
		}
		if time.Since(start) != 0 {
			t.Fatal("publishing waited on the bus")
		}
		synctest.Wait()
		if got := h.Stats(); got.Dropped < 7 || got.Published != 0 {
			t.Fatalf("stats %+v: want the hints beyond the queue dropped", got)
		}
		time.Sleep(time.Second) // fake time: the queued publishes time out
		synctest.Wait()
		// The queue holds 2, and the publisher may have taken one more.
		if got := h.Stats(); got.Dropped != 10 || failed.Load() < 2 || failed.Load() > 3 || failed.Load()+full.Load() != 10 {
			t.Fatalf("stats %+v, %d publish failures, %d queue full: want all 10 dropped, 2 or 3 by timeouts", got, failed.Load(), full.Load())
		}
		time.Sleep(10 * time.Second)
		if n := bus.subscribes.Load(); n < 3 {
			t.Fatalf("subscribed %d times in 10 s: want it tried again", n)
		}
		select {
		case <-h.Subscribed():
			t.Fatal("Subscribed without a subscription")
		default:
		}
		h.Close()
		<-h.Subscribed() // closed by Close
	})
}

// Hints watches a breaker through its Observer: an opening is published
// for the breaker's open time; the publisher's own calls are left to its
// breaker; a forced opening, which has no end, is not published.
func TestBreakerOpeningsArePublished(t *testing.T) {
	noLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		bus := new(fleet.MemoryBus)
		cfg := fleet.HintsConfig{Bus: bus, Dependencies: []string{"pay", "ads"}}
		a, b := newHints(t, cfg), newHints(t, cfg)
		br, err := breaker.New(breaker.Config{Name: "pay", ConsecutiveFailures: 1, OpenFor: 5 * time.Second, OpenJitter: -1, Observer: a})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		p, err := br.Allow()
		if err != nil {
			t.Fatal(err)
		}
		p.Done(breaker.Failure, 0)
		if br.State() != breaker.Open {
			t.Fatalf("breaker %v, want open", br.State())
		}
		synctest.Wait()
		if until, ok := b.Paused("pay", now); !ok || !until.Equal(now.Add(5*time.Second)) {
			t.Fatalf("peer: Paused = %v, %v; want until %v", until, ok, now.Add(5*time.Second))
		}
		if _, ok := a.Paused("pay", now); ok {
			t.Fatal("the publisher paused itself: its breaker does that")
		}
		forced, err := breaker.New(breaker.Config{Name: "ads", Observer: a})
		if err != nil {
			t.Fatal(err)
		}
		forced.ForceOpen()
		synctest.Wait()
		if _, ok := b.Paused("ads", now); ok {
			t.Fatal("a forced opening was published")
		}
	})
}

func TestPausedAllocatesNothing(t *testing.T) {
	noLeaks(t)
	h := newHints(t, fleet.HintsConfig{Dependencies: []string{"pay"}})
	now := time.Now()
	h.RetryAfter("pay", time.Second, now)
	if n := testing.AllocsPerRun(100, func() { h.Paused("pay", now) }); n != 0 {
		t.Fatalf("Paused allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { h.RetryAfter("pay", time.Second, now) }); n != 0 {
		t.Fatalf("a suppressed RetryAfter allocates %v times", n)
	}
}

func TestHintsConfigIsChecked(t *testing.T) {
	noLeaks(t)
	_, err := fleet.NewHints(fleet.HintsConfig{MaxPause: -1, MaxQueued: -1, PublishTimeout: -1, Dependencies: []string{""}})
	if !errors.Is(err, fleet.ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"HintsConfig.MaxPause is -1ns", "HintsConfig.MaxQueued is -1", "HintsConfig.PublishTimeout is -1ns", "HintsConfig.Dependencies"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to name %q", err, want)
		}
	}
	h, err := fleet.NewHints(fleet.HintsConfig{})
	if err != nil {
		t.Fatalf("the zero HintsConfig: %v", err)
	}
	h.RetryAfter("pay", time.Second, time.Now())
	if _, ok := h.Paused("pay", time.Now()); ok {
		t.Fatal("the zero HintsConfig accepted a dependency")
	}
	h.Close()
}

func TestHintKindString(t *testing.T) {
	noLeaks(t)
	for k, want := range map[fleet.HintKind]string{fleet.HintPause: "pause", fleet.HintBreakerOpen: "breaker_open", 0: "unknown", 7: "unknown"} {
		if got := k.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", k, got, want)
		}
	}
}
