package guardhttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/fleet"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// A client's Retry.Pauses hears the Retry-After of a 503 and refuses the
// client's next request locally, before sending it, until the pause ends.
func TestRetryAfterPausesTheClient(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	hints, err := fleet.NewHints(fleet.HintsConfig{Dependencies: []string{"api"}})
	if err != nil {
		t.Fatal(err)
	}
	defer hints.Close()
	c := newClient(t, guardhttp.Config{Name: "api", Retry: guardrail.Retry{MaxAttempts: 1, Pauses: hints}})
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if until, ok := hints.Paused("api", time.Now()); !ok || time.Until(until) > 5*time.Second {
		t.Fatalf("Paused = %v, %v: want the 503's 5 s", until, ok)
	}
	_, err = c.Get(srv.URL)
	var ge *guardrail.Error
	if !errors.Is(err, guardrail.ErrCircuitOpen) || !errors.Is(err, guardrail.ErrPaused) || !errors.As(err, &ge) || ge.RetryIn <= 4*time.Second {
		t.Fatalf("second request: %v, want ErrCircuitOpen around ErrPaused with about 5 s to wait", err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the server got %d requests, want 1", n)
	}
}
