package respond_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/respond"
	"github.com/guardrail-go/guardrail/shed"
)

// TestStatus maps every sentinel, and the errors that carry them, to a
// status and a Retry-After.
func TestStatus(t *testing.T) {
	open := &breaker.OpenError{Until: time.Now().Add(90 * time.Second)}
	urlErr := func(err error) error { return &url.Error{Op: "Get", URL: "http://pricing/", Err: err} }
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tc := range []struct {
		name   string
		err    error
		status int
		ra     time.Duration // -1: about 90 s
	}{
		{"nil", nil, 200, 0},
		{"outcome unknown", guardrail.ErrOutcomeUnknown, 502, 0},
		{"outcome unknown with key, through http.Client", urlErr(&guardhttp.IdempotencyKeyError{Key: "k", Err: &guardrail.Error{Kind: guardrail.ErrOutcomeUnknown, Attempts: 3, Err: guardrail.ErrBudgetExhausted}}), 502, 0},
		{"outcome unknown after a phase timeout", &guardrail.Error{Kind: guardrail.ErrOutcomeUnknown, Err: &guardhttp.TimeoutError{Phase: event.PhaseResponseHeader}}, 502, 0},
		{"canceled", context.Canceled, respond.StatusClientClosedRequest, 0},
		{"canceled, through http.Client", urlErr(context.Canceled), respond.StatusClientClosedRequest, 0},
		{"circuit open", guardrail.ErrCircuitOpen, 503, 0},
		{"circuit open with RetryIn", urlErr(&guardrail.Error{Kind: guardrail.ErrCircuitOpen, RetryIn: 12 * time.Second}), 503, 12 * time.Second},
		{"breaker open", breaker.ErrOpen, 503, 0},
		{"breaker OpenError", fmt.Errorf("pricing: %w", open), 503, -1},
		{"bulkhead full", &guardrail.Error{Kind: guardrail.ErrBulkheadFull, Err: bulkhead.ErrFull}, 503, 0},
		{"bulkhead.ErrFull", bulkhead.ErrFull, 503, 0},
		{"shed", shed.ErrShed, 503, respond.ShedRetryAfter},
		{"shed.Error", &shed.Error{Reason: event.ReasonCapacity}, 503, respond.ShedRetryAfter},
		{"budget exhausted", guardrail.ErrBudgetExhausted, 503, 0},
		{"budget exhausted after a Retry-After", &guardrail.Error{Kind: guardrail.ErrBudgetExhausted, RetryIn: 3 * time.Second}, 503, 3 * time.Second},
		{"budget exhausted after a timeout", &guardrail.Error{Kind: guardrail.ErrBudgetExhausted, Err: &guardhttp.TimeoutError{Phase: event.PhaseConnect}}, 503, 0},
		{"deadline", guardrail.ErrDeadline, 504, 0},
		{"deadline exceeded", urlErr(context.DeadlineExceeded), 504, 0},
		{"phase timeout", urlErr(&guardhttp.TimeoutError{Phase: event.PhaseConnect}), 504, 0},
		{"connection refused", urlErr(refused), 502, 0},
		{"bare *url.Error", urlErr(errors.New("malformed HTTP response")), 502, 0},
		{"other", errors.New("template: no such field"), 500, 0},
	} {
		status, ra := respond.Status(tc.err)
		okRA := ra == tc.ra || (tc.ra == -1 && ra > 85*time.Second && ra <= 90*time.Second)
		if status != tc.status || !okRA {
			t.Errorf("%s: Status = %d, %v; want %d, %v", tc.name, status, ra, tc.status, tc.ra)
		}
	}
}

func TestError(t *testing.T) {
	for _, tc := range []struct {
		err        error
		status     int
		retryAfter string
		body       string
	}{
		{&guardrail.Error{Kind: guardrail.ErrCircuitOpen, RetryIn: 1200 * time.Millisecond}, 503, "2", "circuit open"},
		{shed.ErrShed, 503, "1", "request shed"},
		{&guardrail.Error{Kind: guardrail.ErrOutcomeUnknown, Err: errors.New("read tcp 10.0.0.7:443: reset")}, 502, "", "outcome unknown"},
		{guardrail.ErrDeadline, 504, "", "Gateway Timeout"},
		{context.Canceled, 499, "", "client closed request"},
		{bulkhead.ErrFull, 503, "", "bulkhead full"},
		{guardrail.ErrBudgetExhausted, 503, "", "retry budget exhausted"},
	} {
		w := httptest.NewRecorder()
		respond.Error(w, tc.err)
		if w.Code != tc.status || w.Header().Get("Retry-After") != tc.retryAfter || !strings.Contains(w.Body.String(), tc.body) {
			t.Errorf("%v: %d Retry-After %q %q; want %d %q containing %q", tc.err, w.Code, w.Header().Get("Retry-After"), w.Body.String(), tc.status, tc.retryAfter, tc.body)
		}
		if strings.Contains(w.Body.String(), "10.0.0.7") {
			t.Errorf("%v: the body gives away the error's details: %q", tc.err, w.Body.String())
		}
		if got := w.Header().Get("Content-Type"); got != "text/plain; charset=utf-8" {
			t.Errorf("%v: Content-Type %q", tc.err, got)
		}
	}
}

// TestErrorOpenBreaker: a handler whose dependency's breaker is open
// answers 503 with Retry-After the time to the next probe.
func TestErrorOpenBreaker(t *testing.T) {
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(down.Close)
	g, err := breaker.NewGroup(breaker.GroupConfig{Config: breaker.Config{MinRequests: 1, OpenFor: 40 * time.Second, OpenJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	// The client keys its breakers by host; one failure opens this one.
	p, err := g.Get(strings.TrimPrefix(down.URL, "http://")).Allow()
	if err != nil {
		t.Fatal(err)
	}
	p.Done(breaker.Failure, 0)
	c, err := guardhttp.NewClient(guardhttp.Config{Breakers: g})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	_, err = c.Get(down.URL)
	w := httptest.NewRecorder()
	respond.Error(w, err)
	if w.Code != 503 || (w.Header().Get("Retry-After") != "40" && w.Header().Get("Retry-After") != "39") {
		t.Errorf("%v: %d Retry-After %q, want 503 and 40", err, w.Code, w.Header().Get("Retry-After"))
	}
}
