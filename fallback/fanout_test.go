package fallback_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/fallback"
)

// service is a fake downstream that answers after d, or stops when its
// context is done. It records when and why it ended.
type service struct {
	d       time.Duration
	fail    error // returned after d instead of a value
	ended   time.Duration
	stopped error // ctx's cause when it stopped early
	ctx     context.Context
	t0      time.Time
}

func (s *service) call(ctx context.Context) (string, error) {
	s.ctx, s.t0 = ctx, time.Now()
	defer func() { s.ended = time.Since(s.t0) }()
	timer := time.NewTimer(s.d)
	defer timer.Stop()
	select {
	case <-timer.C:
		if s.fail != nil {
			return "", s.fail
		}
		return "ok", nil
	case <-ctx.Done():
		s.stopped = context.Cause(ctx)
		return "", ctx.Err()
	}
}

// call bounds one downstream call: timeout = min(per-call, time left).
func call(ctx context.Context, perCall time.Duration, s *service) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, perCall)
	defer cancel()
	return s.call(ctx)
}

// An API with a 2 s SLO calls A (700 ms), then B (600 ms) in parallel with
// the optional C (3,000 ms), under a 1,900 ms deadline and a per-call budget
// of 800 ms for A and 900 ms for B and C. C cannot make it: it is cut at its
// 900 ms budget, 700 + 900 = 1,600 ms into the request (1,664 ms when
// measured over real networking), and the answer is partial instead of an
// error.
func TestSlowOptionalPartGivesPartialAnswerInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &service{d: 700 * time.Millisecond}
		b := &service{d: 600 * time.Millisecond}
		c := &service{d: 3000 * time.Millisecond}

		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 1900*time.Millisecond)
		defer cancel()
		av, err := call(ctx, 800*time.Millisecond, a)
		if err != nil {
			t.Fatal(err)
		}
		g := fallback.NewFanout(ctx)
		bp := fallback.Required(g, "B", 900*time.Millisecond, b.call)
		cp := fallback.Optional(g, "C", 900*time.Millisecond, c.call)
		if err := g.Wait(); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		took := time.Since(t0)

		resp := map[string]any{"A": av, "partial": len(g.Missing()) > 0}
		resp["B"], _ = bp.Value()
		resp["C"] = nil
		if v, ok := cp.Value(); ok {
			resp["C"] = v
		}
		body, _ := json.Marshal(resp)
		t.Logf("result: %s took=%dms", body, took.Milliseconds())
		t.Logf("A: done in %v | B: done in %v | C: stopped after %v (%v)", a.ended, b.ended, c.ended, c.stopped)

		if got, want := string(body), `{"A":"ok","B":"ok","C":null,"partial":true}`; got != want {
			t.Errorf("body %s, want %s", got, want)
		}
		if took < 1600*time.Millisecond || took > 1700*time.Millisecond {
			t.Errorf("answered after %v, want 1.6-1.7 s", took)
		}
		if !errors.Is(cp.Err(), context.DeadlineExceeded) || !errors.Is(c.ctx.Err(), context.DeadlineExceeded) || c.ended != 900*time.Millisecond {
			t.Errorf("C: err %v, ctx %v after %v; want cut by its 900ms timeout", cp.Err(), c.ctx.Err(), c.ended)
		}
		if got := g.Missing(); len(got) != 1 || got[0] != "C" {
			t.Errorf("Missing() = %v, want [C]", got)
		}
		rec := httptest.NewRecorder()
		rec.Header().Set("Cache-Control", "max-age=3600")
		if len(g.Missing()) > 0 {
			fallback.MarkPartial(rec.Header())
		}
		if rec.Header().Get(fallback.HeaderPartial) != "true" || rec.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("headers %v, want X-Partial: true and Cache-Control: no-store", rec.Header())
		}
	})
}

// A required failure fails the request at once, not at the deadline: the
// other parts are cancelled, and Wait returns when they have stopped.
func TestRequiredFailureCancelsTheRest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("B: 500")
		b := &service{d: 100 * time.Millisecond, fail: boom}
		c := &service{d: 3 * time.Second}
		d := &service{d: 3 * time.Second}
		ctx, cancel := context.WithTimeout(context.Background(), 1900*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		g := fallback.NewFanout(ctx)
		fallback.Required(g, "B", 0, b.call)
		fallback.Optional(g, "C", 0, c.call)
		dp := fallback.Required(g, "D", 0, d.call)
		err := g.Wait()
		var pe *fallback.PartError
		if !errors.Is(err, boom) || !errors.As(err, &pe) || pe.Part != "B" {
			t.Errorf("Wait = %v, want a PartError for B wrapping its error", err)
		}
		if took := time.Since(t0); took != 100*time.Millisecond {
			t.Errorf("failed after %v, want 100ms (when B failed)", took)
		}
		for name, s := range map[string]*service{"C": c, "D": d} {
			if s.ended != 100*time.Millisecond || !errors.Is(s.stopped, boom) {
				t.Errorf("%s stopped after %v with cause %v, want 100ms, B's failure", name, s.ended, s.stopped)
			}
		}
		if _, ok := dp.Value(); ok {
			t.Errorf("D has a value after being cancelled")
		}
	})
}

// The client goes away at 300 ms: every part stops then, since no one will
// read the answer.
func TestClientDisconnectStopsEveryPart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, disconnect := context.WithCancel(context.Background())
		time.AfterFunc(300*time.Millisecond, disconnect)
		b := &service{d: time.Second}
		c := &service{d: time.Second}
		g := fallback.NewFanout(ctx)
		fallback.Required(g, "B", 0, b.call)
		fallback.Optional(g, "C", 0, c.call)
		if err := g.Wait(); !errors.Is(err, context.Canceled) {
			t.Errorf("Wait = %v, want context.Canceled", err)
		}
		if b.ended != 300*time.Millisecond || c.ended != 300*time.Millisecond {
			t.Errorf("B stopped after %v, C after %v; want both at 300ms", b.ended, c.ended)
		}
	})
}

func TestOptionalFailureIsPartial(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := fallback.NewFanout(context.Background())
		b := fallback.Required(g, "B", 0, (&service{d: 50 * time.Millisecond}).call)
		c := fallback.Optional(g, "C", 0, (&service{d: 10 * time.Millisecond, fail: errors.New("C: 503")}).call)
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		bv, bok := b.Value()
		cv, cok := c.Value()
		if bv != "ok" || !bok || cv != "" || cok || len(g.Missing()) != 1 || c.Err() == nil {
			t.Errorf("B=%q,%v C=%q,%v missing=%v; want B ok, C missing", bv, bok, cv, cok, g.Missing())
		}
	})
}

func TestCompleteIsNotPartial(t *testing.T) {
	g := fallback.NewFanout(context.Background())
	fallback.Optional(g, "C", time.Second, func(context.Context) (int, error) { return 1, nil })
	if err := g.Wait(); err != nil || len(g.Missing()) != 0 {
		t.Errorf("Wait = %v, Missing = %v; want nil, []", err, g.Missing())
	}
	if g.Context().Err() == nil {
		t.Errorf("the group's context is still live after Wait")
	}
}

// A part's panic reaches Wait's goroutine with the part's stack: re-panicking
// the bare value, as Wait used to, lost where the part panicked, since the
// stack of the re-panic is Wait's.
func TestPanicInPartReachesWaitWithItsStack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		other := &service{d: time.Hour}
		g := fallback.NewFanout(context.Background())
		c := fallback.Optional(g, "C", 0, panickingPart)
		fallback.Required(g, "B", 0, other.call)
		defer func() {
			v := recover()
			pe, ok := v.(*fallback.PanicError)
			if !ok {
				t.Fatalf("recovered %T %v, want a *fallback.PanicError", v, v)
			}
			if pe.Part != "C" || pe.Value != "bug in C" {
				t.Errorf("PanicError{Part: %q, Value: %v}, want C's panic value", pe.Part, pe.Value)
			}
			if !strings.Contains(string(pe.Stack), "fallback_test.panickingPart") {
				t.Errorf("stack does not show the panicking function:\n%s", pe.Stack)
			}
			if msg := pe.Error(); !strings.HasPrefix(msg, "fallback: part C panicked: bug in C\n") || !strings.Contains(msg, "panickingPart") {
				t.Errorf("Error() = %q, want the value and then the stack", msg)
			}
			if cpe, ok := c.Err().(*fallback.PanicError); !ok || cpe != pe {
				t.Errorf("the part's Err is %v, want the PanicError Wait panicked with", c.Err())
			}
			if other.ended != 0 {
				t.Errorf("the other part ran %v, want stopped at once", other.ended)
			}
		}()
		g.Wait()
		t.Error("Wait did not panic")
	})
}

func panickingPart(context.Context) (int, error) { panic("bug in C") }

// A panic with an error value unwraps to it.
func TestPanicErrorUnwrapsAnErrorValue(t *testing.T) {
	boom := errors.New("boom")
	g := fallback.NewFanout(context.Background())
	fallback.Required(g, "B", 0, func(context.Context) (int, error) { panic(boom) })
	defer func() {
		err, _ := recover().(error)
		if _, ok := err.(*fallback.PanicError); !ok || !errors.Is(err, boom) {
			t.Errorf("recovered %v; want a *PanicError that Is the value", err)
		}
	}()
	g.Wait()
}
