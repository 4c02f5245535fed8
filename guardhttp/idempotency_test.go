package guardhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

// What if the charge succeeded and the response was
// lost? With a generated key, the client retries and the server's
// idempotency middleware replays the stored answer: one charge.
func TestLostResponseOfAChargeIsReplayedNotRepeated(t *testing.T) {
	var charges, served atomic.Int64
	var dropFirst atomic.Bool
	dropFirst.Store(true)
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "charge "+string(rune('0'+n)))
	})
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := idempotency.New(store, idempotency.Config{SingleTenant: true})
	if err != nil {
		t.Fatal(err)
	}
	inner := keys.Middleware(charge)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		if dropFirst.CompareAndSwap(true, false) {
			// The charge is committed, then the connection drops before the
			// answer leaves.
			inner.ServeHTTP(httptest.NewRecorder(), r)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		inner.ServeHTTP(w, r)
	})
	c := newClient(t, unlimited(guardhttp.Config{IdempotencyKeys: true}))
	resp, err := c.Post(srv.URL, "application/json", strings.NewReader(`{"amount":10}`))
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusCreated || body != "charge 1" {
		t.Errorf("got %d %q, want the first charge's answer replayed", resp.StatusCode, body)
	}
	if got := charges.Load(); got != 1 {
		t.Errorf("charged %d times, want 1", got)
	}
	if got := served.Load(); got != 2 {
		t.Errorf("server saw %d requests, want 2", got)
	}

	// Without a key the POST is not retried: the caller learns the answer
	// was lost, and must not assume either way.
	dropFirst.Store(true)
	plain := newClient(t, unlimited(guardhttp.Config{}))
	if resp, err := plain.Post(srv.URL, "application/json", strings.NewReader(`{"amount":10}`)); err == nil {
		resp.Body.Close()
		t.Fatalf("got %d, want the lost answer as an error", resp.StatusCode)
	}
	if got := served.Load(); got != 3 {
		t.Errorf("server saw %d requests, want 3: a POST without a key is sent once", got)
	}
}
