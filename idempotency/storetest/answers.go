package storetest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/idempotency"
)

// testNotProcessedReleases: an answer that says the request was not
// processed (429 with Retry-After, 503, 408, 425) releases the key on the
// store, so the retry with the same key reaches the handler again; the
// definite answer that follows is stored and replayed. A definite refusal
// (409, 422) is stored at once.
func testNotProcessedReleases(t *testing.T, s Subject) {
	for _, tt := range []struct {
		status   int
		released bool
	}{
		{http.StatusTooManyRequests, true},
		{http.StatusServiceUnavailable, true},
		{http.StatusRequestTimeout, true},
		{http.StatusTooEarly, true},
		{http.StatusInternalServerError, true},
		{http.StatusConflict, false},
		{http.StatusUnprocessableEntity, false},
	} {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			var runs atomic.Int32
			h := middleware(s.Store, idempotency.Config{Logger: discardLogger()})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					w.Header().Set("Retry-After", "2")
					w.WriteHeader(tt.status)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, "charged")
			}))
			key := `"answers-` + strconv.Itoa(tt.status) + "-" + idempotency.NewToken()[:8] + `"`
			do := func() *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":10}`))
				req.Header.Set(idempotency.HeaderKey, key)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				return rec
			}
			if rec := do(); rec.Code != tt.status || rec.Header().Get("Retry-After") != "2" {
				t.Fatalf("first: %d Retry-After %q, want the handler's %d with Retry-After 2", rec.Code, rec.Header().Get("Retry-After"), tt.status)
			}
			second := do()
			third := do()
			replayed := third.Header().Get(idempotency.HeaderReplayed) == "true"
			if tt.released {
				if second.Code != http.StatusCreated || second.Header().Get(idempotency.HeaderReplayed) != "" {
					t.Errorf("retry: %d replayed=%q, want the handler run again (201)", second.Code, second.Header().Get(idempotency.HeaderReplayed))
				}
				if third.Code != http.StatusCreated || !replayed || third.Body.String() != "charged" {
					t.Errorf("third: %d replayed=%v %q, want the stored 201 replayed", third.Code, replayed, third.Body)
				}
				if got := runs.Load(); got != 2 {
					t.Errorf("handler ran %d times, want 2", got)
				}
				return
			}
			if second.Code != tt.status || second.Header().Get(idempotency.HeaderReplayed) != "true" {
				t.Errorf("retry: %d replayed=%q, want the stored %d replayed", second.Code, second.Header().Get(idempotency.HeaderReplayed), tt.status)
			}
			if got := runs.Load(); got != 1 {
				t.Errorf("handler ran %d times, want 1", got)
			}
		})
	}
}

// takenOver wraps a store so that every Release finds its lock lost for
// real: just before it, as when a lease ended and a retry took the key
// over, another holder frees the key and locks it again under a token of
// its own, and then the store itself refuses the release. (The
// integration module holds the gRPC transport's twin.)
type takenOver struct {
	idempotency.Store
	takeovers atomic.Int32
}

func (s *takenOver) Release(ctx context.Context, key, token string) error {
	if err := s.Store.Release(ctx, key, token); err != nil {
		return err
	}
	res, err := s.Store.Begin(ctx, key, fp("someone else"), time.Minute)
	if err != nil {
		return err
	}
	if res.State != idempotency.StateAcquired {
		return fmt.Errorf("storetest: the takeover found %v", res.State)
	}
	s.takeovers.Add(1)
	return s.Store.Release(ctx, key, token) // the old token: the store says ErrLockLost
}

// testLostLockOnRelease: a request whose answer releases its key, but
// whose lock is no longer its own (the store refuses the release with
// ErrLockLost), still gets its answer; the log says it as a warning,
// and nothing is reported as a store failure.
func testLostLockOnRelease(t *testing.T, s Subject) {
	store := &takenOver{Store: s.Store}
	var logs lockedBuffer
	var storeErrors atomic.Int32
	h := middleware(store, idempotency.Config{
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		Observer: countStoreErrors(&storeErrors),
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "database down", http.StatusServiceUnavailable)
	}))
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":10}`))
	req.Header.Set(idempotency.HeaderKey, `"lost-`+idempotency.NewToken()[:8]+`"`)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "database down") {
		t.Fatalf("answer %d %q, want the handler's 503", rec.Code, rec.Body)
	}
	if store.takeovers.Load() != 1 {
		t.Fatalf("%d takeovers, want 1: the release did not reach the store", store.takeovers.Load())
	}
	if n := storeErrors.Load(); n != 0 {
		t.Errorf("%d store_error events, want none: a lost lock is not a store failure", n)
	}
	if l := logs.String(); !strings.Contains(l, "no longer held when releasing it") || strings.Contains(l, "level=ERROR") {
		t.Errorf("log, want one warning that the key was no longer held:\n%s", l)
	}
}

// countStoreErrors counts the store_error events.
func countStoreErrors(n *atomic.Int32) event.Observer {
	return event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.Idempotency && e.Reason == event.ReasonStoreError {
			n.Add(1)
		}
		return ctx
	})
}
