package shed_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/guardrail-go/guardrail/shed"
)

// Over real loopback: with the only slot taken, the next request gets 503 +
// Retry-After and an empty body, and the handler does not run for it.
func TestMiddlewareOverLoopback(t *testing.T) {
	s := mustNew(t, shed.Config{Limit: 1, Shares: map[shed.Priority]float64{shed.Normal: 1}, RetryAfter: 1500e6})
	var calls atomic.Int32
	entered, unblock := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		entered <- struct{}{}
		<-unblock
		w.Write([]byte("ok"))
	})))
	defer srv.Close()

	first := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Error(err)
		}
		first <- resp
	}()
	<-entered // the slot is held

	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "2" || len(body) != 0 {
		t.Errorf("got %d, Retry-After %q, body %q; want 503, \"2\" (1.5 s rounded up), empty",
			resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("handler ran %d times, want 1: the shed request must not reach it", got)
	}

	close(unblock)
	if r := <-first; r != nil {
		r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Errorf("first request: %d, want 200", r.StatusCode)
		}
	}
	if st := s.Stats(); st.Admitted != 1 || st.Shed != 1 || st.InFlight != 0 {
		t.Errorf("stats %+v, want 1 admitted, 1 shed, none in flight", st)
	}
}

func TestMiddlewareCustomPriorityAndRetry(t *testing.T) {
	s := mustNew(t, shed.Config{
		Limit:    10,
		Priority: func(r *http.Request) shed.Priority { return shed.Sheddable }, // e.g. by route
		IsRetry:  func(r *http.Request) bool { return r.URL.Query().Has("retry") },
	})
	h := s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, target := range []string{"/", "/?retry"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, target, nil)
		req.Header.Set(shed.HeaderPriority, "critical") // ignored: Priority is set
		h.ServeHTTP(rec, req)
	}
	st := s.Stats()
	if st.AdmittedByPriority[shed.Sheddable] != 2 || st.AdmittedRetries != 1 {
		t.Errorf("stats %+v, want 2 sheddable admitted, 1 of them a retry", st)
	}
}
