package storetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
)

// RunHTTP runs the middleware's end-to-end tests on real loopback HTTP
// against the store: a response lost after the charge was committed, a
// client that gives up after the commit, 50 concurrent requests with one
// key, a store outage, a handler that outlives its lease three times over,
// a handler that charges and then panics, 100 payments through a fault
// Injector that loses responses, placed inside and outside the middleware,
// answers that say the request was not processed (429, 503, 408, 425,
// 500: the key is released and the retry runs) next to definite ones
// (stored), a release that finds its lock taken over (benign), and a
// caller stopped at its quota of keys while another is served.
// It never runs in a bubble; the lease test takes about three seconds of
// real time.
func RunHTTP(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Subject)
	}{
		{"ResponseLostAfterCommit", testResponseLost},
		{"ClientGaveUpAfterCommit", testClientGaveUp},
		{"Concurrent50", testConcurrent50},
		{"StoreOutage", testOutage},
		{"LeaseRenewedWhileHandlerRuns", testRenewal},
		{"PanicAfterCharge", testPanicAfterCharge},
		{"LoseResponseInsideMiddleware", testLoseResponse(true)},
		{"LoseResponseOutsideMiddleware", testLoseResponse(false)},
		{"NotProcessedReleasesTheKey", testNotProcessedReleases},
		{"LostLockOnReleaseIsBenign", testLostLockOnRelease},
		{"ScopeQuota", testScopeQuotaHTTP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, h.New(t)) })
	}
}

// middleware returns the Server's Middleware for a test; a Config that sets
// no scope is single-tenant, which is what a test with one caller means.
func middleware(store idempotency.Store, cfg idempotency.Config) func(http.Handler) http.Handler {
	if cfg.Scope == nil {
		cfg.SingleTenant = true
	}
	srv, err := idempotency.New(store, cfg)
	if err != nil {
		panic(err)
	}
	return srv.Middleware
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// payments is a handler whose side effect (a charge) is counted.
type payments struct {
	charges atomic.Int32
	// afterCommit, if set, runs between the charge and the response.
	afterCommit func(r *http.Request)
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	n := p.charges.Add(1) // committed: the money moved
	if p.afterCommit != nil {
		p.afterCommit(r)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/payments/ch_%d", n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"charge":"ch_%d","request":%s}`, n, body)
}

// postWithRetries is a careful client: one key per intent, sent unchanged
// on every attempt, retried on a transport error, 409 or 503.
func postWithRetries(t *testing.T, ctx context.Context, client *http.Client, url, key, body string, attempts int, before func(attempt int) context.Context) (*http.Response, []byte) {
	t.Helper()
	for attempt := 1; attempt <= attempts; attempt++ {
		actx := ctx
		if before != nil {
			actx = before(attempt)
		}
		req, err := http.NewRequestWithContext(actx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idempotency.HeaderKey, `"`+key+`"`)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Logf("attempt %d: %v", attempt, err)
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Logf("attempt %d: reading body: %v", attempt, err)
			continue
		}
		if resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusServiceUnavailable {
			t.Logf("attempt %d: %s", attempt, resp.Status)
			continue
		}
		return resp, b
	}
	t.Fatalf("no answer after %d attempts", attempts)
	return nil, nil
}

// testResponseLost is a POST that loses its response after the commit:
// the server charges, writes 201, and the connection is cut before the
// client reads a byte. The client retries with the same key: the charge
// happened once and the client gets the stored answer, byte for byte.
func testResponseLost(t *testing.T, s Subject) {
	pay := &payments{}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", middleware(s.Store, idempotency.Config{Logger: discardLogger()})(pay))

	var (
		attempts atomic.Int32
		lost     = httptest.NewRecorder() // what the first attempt would have received
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if attempts.Add(1) > 1 {
			mux.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(lost, r) // the handler ran and the middleware stored
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		conn.Close() // the response never leaves
	}))
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()

	// The client is guardhttp: it retries the POST because it carries a
	// key, and sends the same key on every attempt.
	grt, err := guardhttp.NewTransport(client.Transport, guardhttp.Config{
		Name: "payments", Retry: guardrail.Retry{
			MaxAttempts: 3,
			Backoff:     backoff.None(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	gclient := &http.Client{Transport: grt}
	key := idempotency.NewToken()
	body := `{"order":"o-1","amount":4200}`
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(idempotency.HeaderKey, `"`+key+`"`)
	req.Header.Set("Content-Type", "application/json")
	resp, err := gclient.Do(req)
	if err != nil {
		t.Fatalf("guardhttp POST with a key: %v", err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}

	if n := pay.charges.Load(); n != 1 {
		t.Fatalf("charged %d times, want exactly once", n)
	}
	if n := attempts.Load(); n != 2 {
		t.Errorf("server saw %d attempts, want 2 (the lost one and the retry)", n)
	}
	if lost.Code != http.StatusCreated {
		t.Fatalf("first attempt produced %d, want 201", lost.Code)
	}
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("retry got %s, want 201 Created", resp.Status)
	}
	if resp.Header.Get(idempotency.HeaderReplayed) != "true" {
		t.Errorf("retry not marked %s: true", idempotency.HeaderReplayed)
	}
	if !bytes.Equal(got, lost.Body.Bytes()) {
		t.Errorf("replayed body %q, want the lost one %q", got, lost.Body.Bytes())
	}
	if g, w := resp.Header.Get("Location"), lost.Header().Get("Location"); g != w {
		t.Errorf("replayed Location %q, want %q", g, w)
	}

	// A new intent (new key) is a new charge.
	postWithRetries(t, t.Context(), client, srv.URL+"/payments", idempotency.NewToken(), body, 1, nil)
	if n := pay.charges.Load(); n != 2 {
		t.Errorf("a new key charged: total %d, want 2", n)
	}
}

// testClientGaveUp is a client timeout on POST /payments: the client gives
// up (its context ends) after the server committed but
// before the response; the server notices the closed connection, yet the
// middleware still stores the response, and the retry gets it.
func testClientGaveUp(t *testing.T, s Subject) {
	committed := make(chan struct{})
	pay := &payments{afterCommit: func(r *http.Request) {
		if r.Header.Get("X-Attempt") == "1" {
			close(committed)
			<-r.Context().Done() // the server saw the client go away
		}
	}}
	stored := make(chan struct{}, 1)
	obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.Idempotency && e.Reason == event.ReasonStored {
			select {
			case stored <- struct{}{}:
			default:
			}
		}
		return ctx
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", middleware(s.Store, idempotency.Config{Logger: discardLogger(), Observer: obs})(pay))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r)
	}))
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()

	key := idempotency.NewToken()
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	transport := &attemptHeader{next: client.Transport}
	client = &http.Client{Transport: transport}
	resp, got := postWithRetries(t, t.Context(), client, srv.URL+"/payments", key, `{"amount":1}`, 3, func(attempt int) context.Context {
		transport.attempt.Store(int32(attempt))
		ctx, cancel := context.WithCancel(t.Context())
		cancels = append(cancels, cancel)
		if attempt == 1 {
			go func() {
				select {
				case <-committed:
					cancel() // the client's deadline passed
				case <-ctx.Done():
				}
			}()
		} else {
			// Do not race the first request's completion. The timer is a
			// guard against a hang, not a wait.
			select {
			case <-stored:
			case <-time.After(10 * time.Second):
				t.Fatal("the first request's response was never stored")
			}
		}
		return ctx
	})
	if n := pay.charges.Load(); n != 1 {
		t.Fatalf("charged %d times, want exactly once", n)
	}
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(idempotency.HeaderReplayed) != "true" {
		t.Errorf("retry got %s replayed=%q, want the stored 201", resp.Status, resp.Header.Get(idempotency.HeaderReplayed))
	}
	if want := `{"charge":"ch_1","request":{"amount":1}}`; string(got) != want {
		t.Errorf("body = %s, want %s", got, want)
	}
}

// attemptHeader numbers attempts for the server.
type attemptHeader struct {
	next    http.RoundTripper
	attempt atomic.Int32
}

func (a *attemptHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Attempt", fmt.Sprint(a.attempt.Load()))
	return a.next.RoundTrip(r)
}

// testConcurrent50 sends 50 identical requests with one key at once: the
// handler runs exactly once, every other request gets 409 while it runs,
// and the next retry gets the replay.
func testConcurrent50(t *testing.T, s Subject) {
	const n = 50
	var runs atomic.Int32
	hold := make(chan struct{})
	h := middleware(s.Store, idempotency.Config{Logger: discardLogger()})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			<-hold
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "created once")
		}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()

	key := idempotency.NewToken()
	post := func() (*http.Response, string, error) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"A1"}`))
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := client.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, string(b), err
	}
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		codes     = map[int]int{}
		answered  atomic.Int32
		noRetryAf atomic.Int32
	)
	for range n {
		wg.Go(func() {
			resp, _, err := post()
			if err != nil {
				t.Error(err)
				return
			}
			if resp.StatusCode == http.StatusConflict && resp.Header.Get("Retry-After") == "" {
				noRetryAf.Add(1)
			}
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
			if answered.Add(1) == n-1 {
				close(hold) // everyone else was answered while it ran
			}
		})
	}
	wg.Wait()
	if got := runs.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want exactly 1", got)
	}
	if codes[http.StatusCreated] != 1 || codes[http.StatusConflict] != n-1 {
		t.Errorf("status counts %v, want 1×201 and %d×409", codes, n-1)
	}
	if noRetryAf.Load() != 0 {
		t.Errorf("%d conflicts without Retry-After", noRetryAf.Load())
	}
	resp, body, err := post()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || body != "created once" || resp.Header.Get(idempotency.HeaderReplayed) != "true" {
		t.Errorf("retry after completion: %s %q replayed=%q, want the replayed 201", resp.Status, body, resp.Header.Get(idempotency.HeaderReplayed))
	}
	if got := runs.Load(); got != 1 {
		t.Errorf("handler ran %d times after the replay, want 1", got)
	}
}

// lockedBuffer is a log destination safe for concurrent handlers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// testOutage cuts the store off: requests are refused with 503 and
// Retry-After, the handler does not run, a clear line is logged; when the
// store is back, what was stored before is replayed and new keys work.
// With FailOpen the handler runs unprotected instead.
func testOutage(t *testing.T, s Subject) {
	if s.Down == nil {
		t.Skip("this store cannot be cut off from its backend")
	}
	var runs atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d", n)
	})
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	closed := middleware(s.Store, idempotency.Config{Logger: logger})(handler)
	open := middleware(s.Store, idempotency.Config{Logger: logger, FailOpen: true})(handler)
	mux := http.NewServeMux()
	mux.Handle("POST /closed", closed)
	mux.Handle("POST /open", open)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()

	post := func(path, key string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader("{}"))
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}

	if code, body, _ := post("/closed", "key-a"); code != http.StatusCreated || body != "run 1" {
		t.Fatalf("before the outage: %d %q", code, body)
	}

	s.Down()
	code, _, hdr := post("/closed", "key-b")
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Errorf("store down: %d Retry-After %q, want 503 with Retry-After", code, hdr.Get("Retry-After"))
	}
	if code, _, _ := post("/closed", "key-a"); code != http.StatusServiceUnavailable {
		t.Errorf("store down, stored key: %d, want 503", code)
	}
	if got := runs.Load(); got != 1 {
		t.Errorf("handler ran %d times during the outage, want 0 more (1 in all)", got)
	}
	if !strings.Contains(logs.String(), "store failed; refusing the request with 503") {
		t.Errorf("no clear log line for the outage; logs:\n%s", logs.String())
	}
	if code, body, _ := post("/open", "key-c"); code != http.StatusCreated || body != "run 2" {
		t.Errorf("FailOpen while down: %d %q, want the handler's 201", code, body)
	}
	if !strings.Contains(logs.String(), "without duplicate protection (FailOpen)") {
		t.Errorf("no log line for FailOpen; logs:\n%s", logs.String())
	}

	s.Up()
	code, body, hdr := post("/closed", "key-a")
	if code != http.StatusCreated || body != "run 1" || hdr.Get(idempotency.HeaderReplayed) != "true" {
		t.Errorf("store back, stored key: %d %q replayed=%q, want the stored \"run 1\"", code, body, hdr.Get(idempotency.HeaderReplayed))
	}
	if code, body, _ := post("/closed", "key-b"); code != http.StatusCreated || body != "run 3" {
		t.Errorf("store back, new key: %d %q, want 201 \"run 3\"", code, body)
	}
	if got := runs.Load(); got != 3 {
		t.Errorf("handler ran %d times, want 3", got)
	}
}

// renewalProbe passes calls to a store and reports, with their time, when
// a key was locked and each renewal that succeeded.
type renewalProbe struct {
	idempotency.Store
	begun   time.Time // before the Begin that locked, from which renewals are scheduled; read after locked
	locked  chan time.Time
	renewed chan time.Time
}

func (p *renewalProbe) Begin(ctx context.Context, key string, fp idempotency.Fingerprint, lease time.Duration) (idempotency.Result, error) {
	start := time.Now()
	res, err := p.Store.Begin(ctx, key, fp, lease)
	if err == nil && res.State == idempotency.StateAcquired {
		p.begun = start
		p.locked <- time.Now()
	}
	return res, err
}

func (p *renewalProbe) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	err := p.Store.Extend(ctx, key, token, lease)
	if err == nil {
		select {
		case p.renewed <- time.Now():
		default:
		}
	}
	return err
}

// testRenewal: a handler that runs for three leases keeps its key on the
// real store, because the middleware renews the lease while it runs. A
// retry sent once the first lease has certainly ended gets 409; the handler
// runs once; its response is stored and replayed.
func testRenewal(t *testing.T, s Subject) {
	const leaseFor = time.Second // renewed every 333 ms
	probe := &renewalProbe{Store: s.Store, locked: make(chan time.Time, 1), renewed: make(chan time.Time, 64)}
	var (
		logs lockedBuffer
		runs atomic.Int32
		hold = make(chan struct{})
	)
	h := middleware(probe, idempotency.Config{Lease: leaseFor, Logger: slog.New(slog.NewTextHandler(&logs, nil))})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				<-hold
			}
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "charged once")
		}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	release := sync.OnceFunc(func() { close(hold) })
	defer release() // before srv.Close, should the test fail early
	client := srv.Client()
	defer client.CloseIdleConnections()
	key := idempotency.NewToken()
	post := func() (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(b)
	}
	// The timers only guard against a hang; nothing here waits on the clock.
	await := func(c <-chan time.Time, what string) time.Time {
		t.Helper()
		select {
		case at := <-c:
			return at
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s within 10s", what)
			return time.Time{}
		}
	}

	type answer struct {
		code int
		body string
	}
	first := make(chan answer, 1)
	go func() {
		resp, body := post()
		first <- answer{resp.StatusCode, body}
	}()
	locked := await(probe.locked, "lock")
	// The store set the lease before Begin returned, so it ended by
	// locked+lease at the latest, had it not been renewed.
	for range 4 {
		await(probe.renewed, "renewal")
	}
	if since := time.Since(locked); since <= leaseFor {
		t.Fatalf("4 renewals %v after the lock, want more than the %v lease", since, leaseFor)
	}
	resp, body := post()
	if resp.StatusCode != http.StatusConflict || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("retry after the first lease: %s Retry-After %q %s, want 409 with Retry-After", resp.Status, resp.Header.Get("Retry-After"), body)
	}
	var last time.Time
	for range 5 { // 9 renewals: three leases
		last = await(probe.renewed, "renewal")
	}
	// Renewals are due every third of the lease, rounded down to the
	// nanosecond, so nine of them span three leases less a few ns.
	if ran := last.Sub(probe.begun); ran < 9*(leaseFor/3) {
		t.Errorf("9 renewals %v after the lock, want at least three leases (%v)", ran, 9*(leaseFor/3))
	}
	release()
	if a := <-first; a.code != http.StatusCreated || a.body != "charged once" {
		t.Errorf("first request: %d %q, want 201 \"charged once\"", a.code, a.body)
	}
	resp, body = post()
	if resp.StatusCode != http.StatusCreated || body != "charged once" || resp.Header.Get(idempotency.HeaderReplayed) != "true" {
		t.Errorf("retry after completion: %s %q replayed=%q, want the stored 201", resp.Status, body, resp.Header.Get(idempotency.HeaderReplayed))
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if out := logs.String(); out != "" {
		t.Errorf("logged:\n%s", out)
	}
}
