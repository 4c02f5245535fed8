package shed_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/shed"
)

// Relieve on a fixed limit: the limit cut, the queue refused at once and
// no new request queued, a longer Retry-After; Relieve(0, 0) gives all of
// it back.
func TestRelieveFixed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := shed.New(shed.Config{Name: "front", Limit: 4, MaxQueue: 10, MaxQueueWait: time.Minute, QueueTarget: time.Minute, QueueInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var toks []shed.Token
		for range 4 {
			tok, err := s.Acquire(ctx, shed.Normal)
			if err != nil {
				t.Fatal(err)
			}
			toks = append(toks, tok)
		}
		queued := make(chan error, 3)
		for range 3 {
			go func() {
				_, err := s.Acquire(ctx, shed.Normal)
				queued <- err
			}()
		}
		synctest.Wait()
		if st := s.Stats(); st.Queued != 3 {
			t.Fatalf("queued %d; want 3", st.Queued)
		}
		start := time.Now()
		s.Relieve(0.5, 30*time.Second)
		for range 3 {
			var se *shed.Error
			if err := <-queued; !errors.As(err, &se) || se.Reason != "capacity" {
				t.Fatalf("a queued request got %v; want refused for capacity", err)
			}
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("the queue was refused after %v; want at once", waited)
		}
		if st := s.Stats(); st.Limit != 2 || st.Queued != 0 {
			t.Fatalf("relieved: limit %d, queued %d; want 2, 0", st.Limit, st.Queued)
		}
		// Two of four released: still at the cut limit, nothing queues.
		toks[0].Release()
		toks[1].Release()
		if _, err := s.Acquire(ctx, shed.Normal); err == nil {
			t.Fatal("admitted at 2 in flight with the limit cut to 2")
		}
		if st := s.Stats(); st.Queued != 0 {
			t.Fatalf("a request queued while relieved")
		}
		h := s.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "30" {
			t.Fatalf("refusal: %d, Retry-After %q; want 503, 30", rec.Code, rec.Header().Get("Retry-After"))
		}
		if ra, ok := s.ReliefRetryAfter(); !ok || ra != 30*time.Second {
			t.Fatalf("ReliefRetryAfter = %v, %v", ra, ok)
		}

		s.Relieve(0, 0)
		if st := s.Stats(); st.Limit != 4 {
			t.Fatalf("after the relief: limit %d; want the fixed 4", st.Limit)
		}
		tok, err := s.Acquire(ctx, shed.Normal)
		if err != nil {
			t.Fatalf("at 2 of 4 after the relief: %v", err)
		}
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil)) // 3 of 4: admitted
		if rec.Code != http.StatusOK {
			t.Fatalf("after the relief: %d; want 200", rec.Code)
		}
		tok.Release()
		toks[2].Release()
		toks[3].Release()
		if _, ok := s.ReliefRetryAfter(); ok {
			t.Fatal("relief Retry-After after Relieve(0, 0)")
		}
	})
}

// Relieve on an adaptive limit lowers the controller's limit too, so that
// the end of the relief does not bring the old limit back at once.
func TestRelieveAdaptive(t *testing.T) {
	s, err := shed.New(shed.Config{Name: "front", Adaptive: shed.Adaptive{InitialLimit: 40, MinLimit: 4}})
	if err != nil {
		t.Fatal(err)
	}
	before := s.Stats().Limit
	s.Relieve(0.25, 0)
	if got := s.Stats().Limit; got != before/4 {
		t.Fatalf("relieved: limit %d; want %d cut to a quarter", got, before)
	}
	s.Relieve(0.5, 0) // again: from the limit in force
	if got := s.Stats().Limit; got != before/8 {
		t.Fatalf("relieved twice: limit %d; want %d", got, before/8)
	}
	if _, ok := s.ReliefRetryAfter(); ok {
		t.Fatal("a relief without a Retry-After of its own reports one")
	}
	s.Relieve(0, 0)
	if got := s.Stats().Limit; got >= before || got < 4 {
		t.Fatalf("after the relief: limit %d; want it to climb back from the cut (floor 4), not jump to %d", got, before)
	}
	s.Relieve(1.5, 0) // ignored
	s.Relieve(-1, 0)
	if got := s.Stats().Limit; got >= before {
		t.Fatalf("an invalid keep changed the limit to %d", got)
	}
}

// Relieve above 1 gives a cut limit back in steps and ends the relief
// once the limit is whole.
func TestRelieveEases(t *testing.T) {
	s, err := shed.New(shed.Config{Name: "front", Limit: 40})
	if err != nil {
		t.Fatal(err)
	}
	if s.Relieve(2, 0) {
		t.Fatal("easing a Shedder that is not relieved relieved it")
	}
	if !s.Relieve(0.25, 5*time.Second) || s.Stats().Limit != 10 {
		t.Fatalf("cut to a quarter: limit %d", s.Stats().Limit)
	}
	for _, want := range []int{20} {
		if !s.Relieve(2, 5*time.Second) || s.Stats().Limit != want {
			t.Fatalf("eased: limit %d; want %d, still relieved", s.Stats().Limit, want)
		}
	}
	if _, ok := s.ReliefRetryAfter(); !ok {
		t.Fatal("the relief's Retry-After went before the relief ended")
	}
	if s.Relieve(2, 5*time.Second) || s.Stats().Limit != 40 {
		t.Fatalf("eased to the whole limit: limit %d; want 40 and the relief over", s.Stats().Limit)
	}
	if _, ok := s.ReliefRetryAfter(); ok {
		t.Fatal("relief Retry-After after the relief ended")
	}
}

// A Retry-After of any size is whole seconds rounded up, never an
// overflowed, negative header: configured or set by a relief.
func TestRetryAfterDoesNotOverflow(t *testing.T) {
	s, err := shed.New(shed.Config{Name: "front", Limit: 1, RetryAfter: time.Duration(math.MaxInt64)})
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := s.Acquire(context.Background(), shed.Normal)
	defer tok.Release()
	h := s.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	header := func() string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		return rec.Header().Get("Retry-After")
	}
	want := strconv.FormatInt(math.MaxInt64/int64(time.Second)+1, 10)
	if got := header(); got != want {
		t.Fatalf("Retry-After %q; want %s", got, want)
	}
	s.Relieve(0.5, 1500*time.Millisecond)
	if got := header(); got != "2" {
		t.Fatalf("relief Retry-After %q for 1.5s; want 2", got)
	}
	s.Relieve(0.5, time.Duration(math.MaxInt64))
	if got := header(); got != want {
		t.Fatalf("relief Retry-After %q; want %s", got, want)
	}
	if d, ok := s.ReliefRetryAfter(); !ok || d <= 0 {
		t.Fatalf("ReliefRetryAfter = %v, %v; want a positive duration however long the relief asks", d, ok)
	}
}
