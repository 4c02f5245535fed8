package storetest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/idempotency"
)

// scoped returns s as a ScopedStore, or skips the test.
func scoped(t *testing.T, s Subject) idempotency.ScopedStore {
	t.Helper()
	ss, ok := s.Store.(idempotency.ScopedStore)
	if !ok {
		t.Skipf("%T is not an idempotency.ScopedStore", s.Store)
	}
	return ss
}

// scope returns a new scope ID of the shape Keys passes (32 hex
// characters).
func scope() string { return idempotency.NewToken() }

func beginScoped(t *testing.T, s idempotency.ScopedStore, sc, k string, f idempotency.Fingerprint, l time.Duration, maxKeys int) (idempotency.Result, error) {
	t.Helper()
	res, err := s.BeginScoped(t.Context(), sc, k, f, l, maxKeys)
	if err != nil && !errors.Is(err, idempotency.ErrScopeFull) {
		t.Fatalf("BeginScoped(%s): %v", k, err)
	}
	return res, err
}

func acquireScoped(t *testing.T, s idempotency.ScopedStore, sc, k string, l time.Duration, maxKeys int) string {
	t.Helper()
	res, err := beginScoped(t, s, sc, k, fp("a"), l, maxKeys)
	if err != nil {
		t.Fatalf("BeginScoped(%s): %v, want it acquired", k, err)
	}
	wantState(t, res, idempotency.StateAcquired)
	return res.Token
}

func wantScopeFull(t *testing.T, s idempotency.ScopedStore, sc, k string, maxKeys int, retryIn time.Duration) {
	t.Helper()
	res, err := beginScoped(t, s, sc, k, fp("a"), lease, maxKeys)
	if !errors.Is(err, idempotency.ErrScopeFull) {
		t.Fatalf("BeginScoped(%s) over the quota of %d: state %v, err %v; want ErrScopeFull", k, maxKeys, res.State, err)
	}
	if res.Token != "" || res.State == idempotency.StateAcquired {
		t.Fatalf("a refused BeginScoped took a lock: %+v", res)
	}
	// The store's clock may run a little ahead of the test's view.
	if res.RetryIn < retryIn-2*time.Second || res.RetryIn > retryIn+time.Second {
		t.Errorf("RetryIn = %v, want about %v (the first of the scope's keys to expire)", res.RetryIn, retryIn)
	}
}

// testScopeQuota: a scope holds at most maxKeys live keys; its live keys
// are still answered when it is full; other scopes are not affected; a
// released key frees its place at once, an in-flight one at its lease's
// end, a completed one at its TTL's end.
func testScopeQuota(t *testing.T, s Subject) {
	ss := scoped(t, s)
	const quota = 3
	a, b := scope(), scope()
	toks := make([]string, quota)
	for i := range quota {
		toks[i] = acquireScoped(t, ss, a, key(t, "a"+strconv.Itoa(i)), lease, quota)
	}
	complete(t, ss, key(t, "a0"), toks[0], sampleResponse(), ttl)
	wantScopeFull(t, ss, a, key(t, "a-new"), quota, lease)

	// Its live keys are answered as Begin answers them.
	res, err := beginScoped(t, ss, a, key(t, "a0"), fp("a"), lease, quota)
	if err != nil {
		t.Fatalf("replay of a live key in a full scope: %v", err)
	}
	wantState(t, res, idempotency.StateCompleted)
	if res, _ := beginScoped(t, ss, a, key(t, "a1"), fp("a"), lease, quota); res.State != idempotency.StateInFlight {
		t.Errorf("in-flight key of a full scope: %v, want in_flight", res.State)
	}
	if res, _ := beginScoped(t, ss, a, key(t, "a1"), fp("other"), lease, quota); res.State != idempotency.StateMismatch {
		t.Errorf("reused key of a full scope: %v, want mismatch", res.State)
	}

	// Another scope is not affected.
	for i := range quota {
		acquireScoped(t, ss, b, key(t, "b"+strconv.Itoa(i)), lease, quota)
	}

	// A released key frees its place at once.
	if err := ss.Release(t.Context(), key(t, "a1"), toks[1]); err != nil {
		t.Fatal(err)
	}
	tok := acquireScoped(t, ss, a, key(t, "a-new"), lease, quota)
	wantScopeFull(t, ss, a, key(t, "a-newer"), quota, lease)
	extend(t, ss, key(t, "a-new"), tok, 2*lease)

	// At the lease's end the in-flight key a2 frees its place; the
	// extended one and the completed one do not.
	s.Advance(lease + time.Second)
	acquireScoped(t, ss, a, key(t, "a-newer"), lease, quota)
	wantScopeFull(t, ss, a, key(t, "a-newest"), quota, lease-time.Second)

	// At the TTL's end every place is free.
	s.Advance(ttl)
	for i := range quota {
		acquireScoped(t, ss, a, key(t, "a-after"+strconv.Itoa(i)), lease, quota)
	}

	// A negative quota is no limit.
	c := scope()
	for i := range quota + 2 {
		acquireScoped(t, ss, c, key(t, "c"+strconv.Itoa(i)), lease, -1)
	}
	// Zero is a quota of zero: Keys passes its own default for zero.
	wantScopeFull(t, ss, scope(), key(t, "d"), 0, 0)
}

// testScopeQuotaUnderContention: concurrent BeginScoped calls for new
// keys of one scope lock exactly maxKeys of them.
func testScopeQuotaUnderContention(t *testing.T, s Subject) {
	ss := scoped(t, s)
	const n, quota = 40, 7
	sc := scope()
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		acquired atomic.Int32
		full     atomic.Int32
		errs     = make(chan error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := ss.BeginScoped(context.Background(), sc, key(t, "c"+strconv.Itoa(i)+"x"), fp("a"), lease, quota)
			switch {
			case errors.Is(err, idempotency.ErrScopeFull):
				full.Add(1)
			case err != nil:
				errs <- err
			case res.State == idempotency.StateAcquired:
				acquired.Add(1)
			default:
				errs <- errors.New("unexpected state " + res.State.String())
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := acquired.Load(); got != quota {
		t.Errorf("acquired %d keys of one scope, want exactly the quota of %d", got, quota)
	}
	if got := full.Load(); got != n-quota {
		t.Errorf("%d refused with ErrScopeFull, want %d", got, n-quota)
	}
}

// testScopeQuotaHTTP: over real HTTP, with several instances sharing the
// store, a caller sending new keys stops at MaxKeysPerScope with 429 and
// a Retry-After, nothing charged, while another caller is served and the
// first caller's retries of its live keys are replayed.
func testScopeQuotaHTTP(t *testing.T, s Subject) {
	const quota = 5
	pay := &payments{}
	byHeader := func(r *http.Request) (string, error) { return r.Header.Get("X-Caller"), nil }
	var urls []string
	for range 2 { // two instances
		mux := http.NewServeMux()
		mux.Handle("POST /payments", middleware(s.Store, idempotency.Config{Scope: byHeader, MaxKeysPerScope: quota, Logger: discardLogger()})(pay))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL+"/payments")
	}
	post := func(i int, caller, key string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, urls[i%len(urls)], strings.NewReader(`{"amount":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idempotency.HeaderKey, key)
		req.Header.Set("X-Caller", caller)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	var codes []int
	for i := range quota + 3 {
		codes = append(codes, post(i, "mallory", "m"+strconv.Itoa(i)).StatusCode)
	}
	for i, code := range codes {
		want := http.StatusCreated
		if i >= quota {
			want = http.StatusTooManyRequests
		}
		if code != want {
			t.Errorf("mallory's request %d: %d, want %d (codes %v)", i, code, want, codes)
		}
	}
	resp := post(0, "mallory", "m-last")
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != http.StatusTooManyRequests || err != nil || ra < 1 {
		t.Errorf("over the quota: %d, Retry-After %q; want 429 with a delay", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp := post(1, "mallory", "m0"); resp.StatusCode != http.StatusCreated || resp.Header.Get(idempotency.HeaderReplayed) != "true" {
		t.Errorf("mallory's retry of a live key: %d, replayed %q; want the stored 201", resp.StatusCode, resp.Header.Get(idempotency.HeaderReplayed))
	}
	for i := range 2 {
		if code := post(i, "alice", "a"+strconv.Itoa(i)).StatusCode; code != http.StatusCreated {
			t.Errorf("alice's request %d: %d, want 201", i, code)
		}
	}
	if got, want := pay.charges.Load(), int32(quota+2); got != want {
		t.Errorf("%d charges, want %d", got, want)
	}
}
