package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/fault"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
)

// ledger is a payments handler that counts the charges of each order, so
// that a duplicate is seen as such and not only as a total.
type ledger struct {
	mu      sync.Mutex
	charges map[string]int // guarded by mu; by order
	total   atomic.Int32
}

// charge records a charge for the order in the request body and returns
// its number.
func (l *ledger) charge(r *http.Request) (int32, string) {
	var p struct{ Order string }
	body, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(body, &p)
	l.mu.Lock()
	if l.charges == nil {
		l.charges = map[string]int{}
	}
	l.charges[p.Order]++
	l.mu.Unlock()
	return l.total.Add(1), p.Order
}

// duplicates returns the charges beyond the first of each order.
func (l *ledger) duplicates() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.charges {
		n += c - 1
	}
	return n
}

func (l *ledger) orders() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.charges)
}

// quietServer starts a loopback server for h that does not log the panics
// the tests provoke.
func quietServer(h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	return srv
}

// testPanicAfterCharge is a handler that charges and then panics, behind
// the middleware, called by guardhttp attaching a key and retrying (it
// retries a keyed POST on a cut connection and on 500). The charge may
// have been committed, so no retry may run the handler again: the retries
// get the replayed unknown outcome, and the card is charged once. A
// handler that panics before charging and says so with Release has its
// retry run.
func testPanicAfterCharge(t *testing.T, s Subject) {
	var (
		pay      ledger
		attempts atomic.Int32
	)
	h := middleware(s.Store, idempotency.Config{Logger: discardLogger()})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		if r.URL.Query().Has("release") && attempts.Load() == 1 {
			idempotency.Release(r.Context()) // failed before charging
			panic("bug before the charge")
		}
		n, _ := pay.charge(r)
		if !r.URL.Query().Has("release") {
			panic("bug after the charge") // the money moved
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", n)
	}))
	srv := quietServer(h)
	defer srv.Close()
	base := srv.Client()
	defer base.CloseIdleConnections()
	grt, err := guardhttp.NewTransport(base.Transport, guardhttp.Config{
		Name: "payments", Retry: guardrail.Retry{
			MaxAttempts: 3,
			Backoff:     backoff.None(),
		},
		IdempotencyKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: grt}

	post := func(url string) (*http.Response, string) {
		resp, err := client.Post(url, "application/json", strings.NewReader(`{"order":"o-1","amount":4200}`))
		if err != nil {
			t.Fatalf("POST %s: %v", url, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}

	resp, body := post(srv.URL + "/payments")
	t.Logf("charge then panic: %d charges for 1 payment, %d handler runs, final answer %s replayed=%s",
		pay.total.Load(), attempts.Load(), resp.Status, resp.Header.Get(idempotency.HeaderReplayed))
	if n := pay.total.Load(); n != 1 {
		t.Fatalf("charged %d times, want once", n)
	}
	if resp.StatusCode != http.StatusInternalServerError || resp.Header.Get(idempotency.HeaderReplayed) != "true" ||
		!strings.Contains(body, "Outcome unknown") {
		t.Errorf("retry got %s replayed=%q %s; want the replayed unknown outcome", resp.Status, resp.Header.Get(idempotency.HeaderReplayed), body)
	}
	if n := attempts.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}

	attempts.Store(0)
	pay = ledger{}
	resp, _ = post(srv.URL + "/payments?release")
	if n := pay.total.Load(); n != 1 || resp.StatusCode != http.StatusCreated || attempts.Load() != 2 {
		t.Errorf("released before the charge: %d charges, %d runs, %s; want the retry run and charged once", n, attempts.Load(), resp.Status)
	}
}

// testLoseResponse is 100 payments through a fault Injector whose
// lose_response rule runs the request and then cuts the connection, half
// the time, with a client that retries each payment with its key. With the
// Injector inside the middleware the middleware sees a hijacked
// connection (an unknown outcome: the retries are told so); outside it,
// the middleware stored the response, and the retries get it. No payment
// is charged twice either way.
func testLoseResponse(inside bool) func(t *testing.T, s Subject) {
	return func(t *testing.T, s Subject) {
		const payments, attempts = 100, 4
		var pay ledger
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, order := pay.charge(r)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"charge":%d,"order":%q}`, n, order)
		})
		inj, err := fault.New(fault.Config{Rules: []fault.Rule{{Name: "lost-after-commit", Probability: 0.5, Fault: fault.LoseResponse{}}}})
		if err != nil {
			t.Fatal(err)
		}
		defer inj.Close()
		keys := middleware(s.Store, idempotency.Config{Logger: discardLogger()})
		var h http.Handler
		if inside {
			h = keys(inj.Middleware(handler))
		} else {
			h = inj.Middleware(keys(handler))
		}
		srv := quietServer(h)
		defer srv.Close()
		client := srv.Client()
		defer client.CloseIdleConnections()

		var created, replayed, unknown, inFlight, noAnswer int
		for i := range payments {
			key := idempotency.NewToken()
			body := fmt.Sprintf(`{"order":"o-%d","amount":100}`, i)
			status, replay := payWithRetries(t.Context(), client, srv.URL+"/payments", key, body, attempts)
			switch {
			case status == 0:
				noAnswer++
			case status == http.StatusConflict:
				inFlight++ // every retry came while the first was still being recorded
			case status == http.StatusCreated && replay:
				replayed++
				created++
			case status == http.StatusCreated:
				created++
			case status == http.StatusInternalServerError && replay:
				unknown++
			default:
				t.Errorf("payment %d: status %d", i, status)
			}
		}
		var lost uint64
		for _, c := range inj.Counters() {
			lost += c.Fired
		}
		t.Logf("lose_response %s the middleware: %d charges for %d payments (%d duplicates); %d responses lost; %d answered 201 (%d replayed), %d told the outcome is unknown, %d still in flight (409) and %d without an answer after %d attempts",
			placement(inside), pay.total.Load(), payments, pay.duplicates(), lost, created, replayed, unknown, inFlight, noAnswer, attempts)
		if d := pay.duplicates(); d != 0 {
			t.Errorf("%d duplicate charges, want 0", d)
		}
		if n := pay.orders(); n != payments {
			t.Errorf("%d payments charged, want all %d (the first attempt of each reaches the handler)", n, payments)
		}
		if lost == 0 {
			t.Error("no response was lost: the test tested nothing")
		}
		if inflight := inFlight; inside && inflight != 0 {
			// The key is settled before the handler can close the
			// connection, so even a retry sent at once finds it so.
			t.Errorf("%d payments still in flight at every retry, want 0", inflight)
		}
		if inside && unknown == 0 || !inside && replayed == 0 {
			t.Errorf("no retry got the %s answer", map[bool]string{true: "unknown-outcome", false: "replayed"}[inside])
		}
	}
}

func placement(inside bool) string {
	if inside {
		return "inside"
	}
	return "outside"
}

// payWithRetries sends one payment with key, up to attempts times while
// the connection is cut or the answer is 409 or 503, without waiting, and
// returns the final status (0 when no attempt got an answer) and whether it
// was replayed.
func payWithRetries(ctx context.Context, client *http.Client, url, key, body string, attempts int) (int, bool) {
	status := 0
	for range attempts {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			return 0, false
		}
		req.Header.Set(idempotency.HeaderKey, `"`+key+`"`)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			continue
		}
		if status = resp.StatusCode; status == http.StatusConflict || status == http.StatusServiceUnavailable {
			continue
		}
		return status, resp.Header.Get(idempotency.HeaderReplayed) == "true"
	}
	return status, false
}
