package guardhttp_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// After 1,000 requests of which half were retried after a 503 with a body,
// the connections went back to the pool: the server saw no more of them
// than requests ran at once, and the client keeps no more idle than its
// pool allows. TestMain checks that no goroutine is left behind.
func TestThousandRequestsHalfRetriedKeepThePoolBounded(t *testing.T) {
	const requests, workers = 1000, 8
	var originals, retries atomic.Int64
	busy := strings.Repeat("overloaded ", 1000) // 11 kB to drain
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(deadline.HeaderRetryAttempt) != "" {
			retries.Add(1)
			_, _ = io.WriteString(w, "ok")
			return
		}
		if originals.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, busy)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	c := newClient(t, unlimited(guardhttp.Config{}))
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= requests {
				resp, err := get(t, context.Background(), c, srv.URL)
				if err != nil {
					errs <- err
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || string(b) != "ok" {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a request failed: %v", err)
	}
	if got := originals.Load(); got != requests {
		t.Errorf("server saw %d original requests, want %d", got, requests)
	}
	if got := retries.Load(); got != requests/2 {
		t.Errorf("server saw %d retries, want %d", got, requests/2)
	}
	// One connection per worker, give or take the dials net/http starts
	// when no idle connection is free and then keeps when one frees up
	// first (a plain http.Client does the same). Had the 503s not been
	// drained, each of the 500 retries would have needed a new one.
	opened := srv.newConns.Load()
	if opened > 2*workers {
		t.Errorf("server saw %d connections for %d workers: responses thrown away did not return theirs to the pool", opened, workers)
	}
	if idle := opened - srv.closedConns.Load(); idle > guardhttp.DefaultMaxIdleConnsPerHost {
		t.Errorf("client holds %d connections, pool limit %d", idle, guardhttp.DefaultMaxIdleConnsPerHost)
	}
}
