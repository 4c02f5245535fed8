package guardhttp_test

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/throttle"
)

func TestHedgeSecondAttemptWinsAndTheFirstIsCancelled(t *testing.T) {
	var calls atomic.Int64
	cancelled := make(chan struct{}, 1)
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			select {
			case <-r.Context().Done(): // the client gave up on this attempt
				cancelled <- struct{}{}
			case <-time.After(10 * time.Second):
			}
			return
		}
		_, _ = io.WriteString(w, "fast")
	})
	tr, err := guardhttp.NewTransport(nil, guardhttp.Config{Retry: guardrail.Retry{Budget: budget.Unlimited()}, Hedge: &guardrail.HedgeConfig{Delay: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	start := time.Now()
	resp, err := c.Get(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if took := time.Since(start); string(b) != "fast" || took > 5*time.Second {
		t.Fatalf("got %q after %v; want the hedge's answer at once", b, took)
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the first attempt's request was never cancelled on the server")
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("server saw %d requests; want 2", got)
	}
}

func TestHedgeNotForPost(t *testing.T) {
	var calls atomic.Int64
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		time.Sleep(100 * time.Millisecond)
	})
	tr, _ := guardhttp.NewTransport(nil, guardhttp.Config{Retry: guardrail.Retry{Budget: budget.Unlimited()}, Hedge: &guardrail.HedgeConfig{Delay: 5 * time.Millisecond}})
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Post(s.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if calls.Load() != 1 {
		t.Errorf("server saw %d POSTs; a POST without a key is never hedged", calls.Load())
	}
}

func TestHedgePausedByOverloadAnswer(t *testing.T) {
	var calls atomic.Int64
	var overload atomic.Bool
	overload.Store(true)
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if overload.Load() {
			w.WriteHeader(http.StatusServiceUnavailable) // no Retry-After: the status says it
			return
		}
		time.Sleep(60 * time.Millisecond)
	})
	tr, _ := guardhttp.NewTransport(nil, guardhttp.Config{Retry: guardrail.Retry{
		MaxAttempts: 1,
		Budget:      budget.Unlimited(),
	},
		Breakers: noBreakers(t),
		Hedge:    &guardrail.HedgeConfig{Delay: 30 * time.Millisecond, OverloadPause: time.Minute}})
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	resp, err := c.Get(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// The first call may itself be hedged when its 503 takes longer than
	// the 30 ms delay (a busy machine): count only what follows the 503.
	before := calls.Load()
	overload.Store(false)
	for range 3 {
		resp, err := c.Get(s.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got := calls.Load() - before; got != 3 {
		t.Errorf("server saw %d requests for 3 calls after the 503; want 3: no hedge for a minute after a 503", got)
	}
}

func TestThrottlerRejectsLocallyOnOverload(t *testing.T) {
	var calls atomic.Int64
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusTooManyRequests)
	})
	th, err := throttle.New(throttle.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := guardhttp.NewTransport(nil, guardhttp.Config{Retry: guardrail.Retry{MaxAttempts: 1}, Breakers: noBreakers(t), Throttler: th})
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	throttled := 0
	for range 200 {
		resp, err := c.Get(s.URL)
		switch {
		case errors.Is(err, guardrail.ErrThrottled):
			throttled++
		case err != nil:
			t.Fatal(err)
		default:
			resp.Body.Close()
		}
	}
	if got := calls.Load(); got > 30 || int(got)+throttled != 200 {
		t.Errorf("server saw %d requests, %d throttled; want most of 200 rejected locally", got, throttled)
	}
}

func TestConfigHedgeInvalid(t *testing.T) {
	_, err := guardhttp.NewTransport(nil, guardhttp.Config{Hedge: &guardrail.HedgeConfig{MaxHedges: -1}})
	if !errors.Is(err, guardhttp.ErrInvalidConfig) || !errors.Is(err, guardrail.ErrInvalidConfig) {
		t.Errorf("err %v; want ErrInvalidConfig naming Hedge.MaxHedges", err)
	}
}

// noBreakers is a breaker group that never trips, so only the piece under
// test acts.
func noBreakers(t *testing.T) *breaker.Group {
	g, err := breaker.NewGroup(breaker.GroupConfig{Config: breaker.Config{Mode: breaker.Disabled}})
	if err != nil {
		t.Fatal(err)
	}
	return g
}
