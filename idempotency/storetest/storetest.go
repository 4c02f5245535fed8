// Package storetest is the conformance suite every idempotency.Store passes:
// written once, run by each store's tests against a real backend.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/idempotency"
)

// Harness tells the suite how to make and control the store under test. It
// is read-only once built and may be shared by tests.
type Harness struct {
	// New returns an empty store for one test, isolated from every other
	// test (its own key prefix or table), and releases it with t.Cleanup.
	New func(t *testing.T) Subject

	// Bubble, if set, runs each store test inside it: a store on the
	// process clock passes synctest.Test so that Advance is exact and
	// instant. Tests that use real network servers never run in it.
	Bubble func(t *testing.T, f func(t *testing.T))
}

// Subject is one store under test and its controls, owned by one test.
type Subject struct {
	Store idempotency.Store

	// Advance makes the store behave as if d had passed: leases and TTLs
	// ending within d expire, later ones are d shorter. A store on the
	// process clock sleeps inside a synctest bubble; a store on a server's
	// clock shifts the expiry of this test's keys by d.
	Advance func(d time.Duration)

	// Down cuts the store off from its backend (for a real server: closes
	// the network path to it) and Up restores it; data the backend keeps
	// must survive. Nil when the store cannot be cut off; the outage tests
	// are then skipped.
	Down, Up func()
}

func fp(s string) idempotency.Fingerprint {
	var f idempotency.Fingerprint
	copy(f[:], s)
	return f
}

// key returns a store key of the shape the middleware uses (64 hex chars).
func key(t *testing.T, suffix string) string {
	k := t.Name() + "/" + suffix
	for len(k) < 64 {
		k += "0"
	}
	return k
}

const (
	lease = 10 * time.Second
	ttl   = time.Hour
)

// sampleResponse has every byte value in its body, repeated headers and a
// status other than 200, so byte-for-byte comparison means something.
func sampleResponse() *idempotency.Response {
	body := make([]byte, 0, 3*256)
	for range 3 {
		for b := range 256 {
			body = append(body, byte(b))
		}
	}
	return &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/octet-stream"},
			"Location":     {"/payments/ch_1"},
			"X-Multi":      {"a", "b", ""},
		},
		Body: body,
	}
}

// Run runs the store conformance tests.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Subject)
	}{
		{"AcquireThenInFlight", testAcquireThenInFlight},
		{"ExclusiveUnderContention", testExclusive},
		{"CompleteReplaysByteForByte", testCompleteReplay},
		{"EmptyResponse", testEmptyResponse},
		{"LargeResponse", testLargeResponse},
		{"Release", testRelease},
		{"Mismatch", testMismatch},
		{"LeaseExpiryTakeover", testLeaseExpiry},
		{"TTLExpiry", testTTLExpiry},
		{"TokenOwnership", testTokenOwnership},
		{"IndependentKeys", testIndependentKeys},
		{"CanceledContext", testCanceledContext},
		{"MiddlewareLeaseExpiry", testMiddlewareLeaseExpiry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if h.Bubble != nil {
				h.Bubble(t, func(t *testing.T) { tt.fn(t, h.New(t)) })
				return
			}
			tt.fn(t, h.New(t))
		})
	}
}

func begin(t *testing.T, s idempotency.Store, k string, f idempotency.Fingerprint, l time.Duration) idempotency.Result {
	t.Helper()
	res, err := s.Begin(t.Context(), k, f, l)
	if err != nil {
		t.Fatalf("Begin(%s): %v", k, err)
	}
	return res
}

func wantState(t *testing.T, res idempotency.Result, want idempotency.State) {
	t.Helper()
	if res.State != want {
		t.Fatalf("Begin state = %v, want %v", res.State, want)
	}
}

func acquire(t *testing.T, s idempotency.Store, k string, f idempotency.Fingerprint, l time.Duration) string {
	t.Helper()
	res := begin(t, s, k, f, l)
	wantState(t, res, idempotency.StateAcquired)
	if res.Token == "" {
		t.Fatal("acquired with an empty token")
	}
	return res.Token
}

func complete(t *testing.T, s idempotency.Store, k, tok string, r *idempotency.Response, ttl time.Duration) {
	t.Helper()
	if err := s.Complete(t.Context(), k, tok, r, ttl); err != nil {
		t.Fatalf("Complete: %v", err)
	}
}

func sameResponse(t *testing.T, got, want *idempotency.Response) {
	t.Helper()
	if got == nil {
		t.Fatal("completed without a response")
	}
	if got.Status != want.Status {
		t.Errorf("status = %d, want %d", got.Status, want.Status)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("body differs: got %d bytes, want %d", len(got.Body), len(want.Body))
	}
	if len(got.Header) != 0 || len(want.Header) != 0 {
		if !reflect.DeepEqual(got.Header, want.Header) {
			t.Errorf("header = %v, want %v", got.Header, want.Header)
		}
	}
	if got.BodyOmitted != want.BodyOmitted {
		t.Errorf("BodyOmitted = %v, want %v", got.BodyOmitted, want.BodyOmitted)
	}
}

func testAcquireThenInFlight(t *testing.T, s Subject) {
	k := key(t, "k")
	acquire(t, s.Store, k, fp("a"), lease)
	res := begin(t, s.Store, k, fp("a"), lease)
	wantState(t, res, idempotency.StateInFlight)
	if res.RetryIn <= 0 || res.RetryIn > lease {
		t.Errorf("RetryIn = %v, want in (0, %v]", res.RetryIn, lease)
	}
	if res.Token != "" {
		t.Errorf("in-flight result leaked the holder's token")
	}
}

func testExclusive(t *testing.T, s Subject) {
	const n = 50
	k := key(t, "k")
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		acquired atomic.Int32
		inFlight atomic.Int32
		errs     = make(chan error, n)
	)
	for range n {
		wg.Go(func() {
			<-start
			res, err := s.Store.Begin(context.Background(), k, fp("a"), lease)
			switch {
			case err != nil:
				errs <- err
			case res.State == idempotency.StateAcquired:
				acquired.Add(1)
			case res.State == idempotency.StateInFlight:
				inFlight.Add(1)
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
	if got, want := acquired.Load(), int32(1); got != want {
		t.Errorf("acquired %d times, want %d", got, want)
	}
	if got, want := inFlight.Load(), int32(n-1); got != want {
		t.Errorf("in flight %d times, want %d", got, want)
	}
}

func testCompleteReplay(t *testing.T, s Subject) {
	k := key(t, "k")
	tok := acquire(t, s.Store, k, fp("a"), lease)
	want := sampleResponse()
	complete(t, s.Store, k, tok, want, ttl)
	for range 2 { // replays do not consume the response
		res := begin(t, s.Store, k, fp("a"), lease)
		wantState(t, res, idempotency.StateCompleted)
		sameResponse(t, res.Response, sampleResponse())
	}
	// The store kept its own copy.
	want.Body[0] = 0xff
	want.Header.Set("Location", "changed")
	res := begin(t, s.Store, k, fp("a"), lease)
	sameResponse(t, res.Response, sampleResponse())
}

func testEmptyResponse(t *testing.T, s Subject) {
	k := key(t, "k")
	tok := acquire(t, s.Store, k, fp("a"), lease)
	want := &idempotency.Response{Status: http.StatusNoContent}
	complete(t, s.Store, k, tok, want, ttl)
	res := begin(t, s.Store, k, fp("a"), lease)
	wantState(t, res, idempotency.StateCompleted)
	sameResponse(t, res.Response, want)

	k2 := key(t, "omitted")
	tok = acquire(t, s.Store, k2, fp("a"), lease)
	want = &idempotency.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"text/plain"}}, BodyOmitted: true}
	complete(t, s.Store, k2, tok, want, ttl)
	res = begin(t, s.Store, k2, fp("a"), lease)
	sameResponse(t, res.Response, want)
}

func testLargeResponse(t *testing.T, s Subject) {
	k := key(t, "k")
	tok := acquire(t, s.Store, k, fp("a"), lease)
	body := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	want := &idempotency.Response{Status: http.StatusOK, Body: body}
	complete(t, s.Store, k, tok, want, ttl)
	res := begin(t, s.Store, k, fp("a"), lease)
	wantState(t, res, idempotency.StateCompleted)
	sameResponse(t, res.Response, want)
}

func testRelease(t *testing.T, s Subject) {
	k := key(t, "k")
	tok := acquire(t, s.Store, k, fp("a"), lease)
	if err := s.Store.Release(t.Context(), k, tok); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Free again, for any payload: a released key is forgotten.
	tok2 := acquire(t, s.Store, k, fp("b"), lease)
	if tok2 == tok {
		t.Errorf("new lock reused the released token %q", tok)
	}
	if err := s.Store.Release(t.Context(), k, tok); !errors.Is(err, idempotency.ErrLockLost) {
		t.Errorf("Release with the old token: %v, want ErrLockLost", err)
	}
	wantState(t, begin(t, s.Store, k, fp("b"), lease), idempotency.StateInFlight)
}

func testMismatch(t *testing.T, s Subject) {
	k := key(t, "k")
	tok := acquire(t, s.Store, k, fp("a"), lease)
	wantState(t, begin(t, s.Store, k, fp("b"), lease), idempotency.StateMismatch)
	complete(t, s.Store, k, tok, sampleResponse(), ttl)
	res := begin(t, s.Store, k, fp("b"), lease)
	wantState(t, res, idempotency.StateMismatch)
	if res.Response != nil {
		t.Error("a mismatch returned the stored response")
	}
	// The mismatching Begin changed nothing.
	res = begin(t, s.Store, k, fp("a"), lease)
	wantState(t, res, idempotency.StateCompleted)
	sameResponse(t, res.Response, sampleResponse())
}

func testLeaseExpiry(t *testing.T, s Subject) {
	k := key(t, "k")
	const short = 2 * time.Second
	old := acquire(t, s.Store, k, fp("a"), short)
	s.Advance(short / 2)
	res := begin(t, s.Store, k, fp("a"), lease)
	wantState(t, res, idempotency.StateInFlight)
	if res.RetryIn > short/2+100*time.Millisecond {
		t.Errorf("RetryIn = %v after half the lease, want <= %v", res.RetryIn, short/2)
	}
	s.Advance(short/2 + 100*time.Millisecond)
	// The holder died: its lease ended and another request takes over.
	tok := acquire(t, s.Store, k, fp("a"), lease)
	if tok == old {
		t.Fatalf("takeover reused the expired token")
	}
	if err := s.Store.Complete(t.Context(), k, old, &idempotency.Response{Status: 500}, ttl); !errors.Is(err, idempotency.ErrLockLost) {
		t.Errorf("late Complete by the expired holder: %v, want ErrLockLost", err)
	}
	if err := s.Store.Release(t.Context(), k, old); !errors.Is(err, idempotency.ErrLockLost) {
		t.Errorf("late Release by the expired holder: %v, want ErrLockLost", err)
	}
	wantState(t, begin(t, s.Store, k, fp("a"), lease), idempotency.StateInFlight)
	complete(t, s.Store, k, tok, sampleResponse(), ttl)
	res = begin(t, s.Store, k, fp("a"), lease)
	wantState(t, res, idempotency.StateCompleted)
	sameResponse(t, res.Response, sampleResponse())

	// An expired lease nobody took over cannot be completed either.
	k2 := key(t, "k2")
	old = acquire(t, s.Store, k2, fp("a"), short)
	s.Advance(short + 100*time.Millisecond)
	if err := s.Store.Complete(t.Context(), k2, old, sampleResponse(), ttl); !errors.Is(err, idempotency.ErrLockLost) {
		t.Errorf("Complete after the lease ended: %v, want ErrLockLost", err)
	}
	acquire(t, s.Store, k2, fp("b"), lease)
}

func testTTLExpiry(t *testing.T, s Subject) {
	k := key(t, "k")
	tok := acquire(t, s.Store, k, fp("a"), lease)
	const short = 30 * time.Second
	complete(t, s.Store, k, tok, sampleResponse(), short)
	s.Advance(short - 5*time.Second)
	wantState(t, begin(t, s.Store, k, fp("a"), lease), idempotency.StateCompleted)
	wantState(t, begin(t, s.Store, k, fp("b"), lease), idempotency.StateMismatch)
	s.Advance(5*time.Second + 100*time.Millisecond)
	// Expired: the key is forgotten, any payload may use it again.
	acquire(t, s.Store, k, fp("b"), lease)
}

func testTokenOwnership(t *testing.T, s Subject) {
	k := key(t, "k")
	tok := acquire(t, s.Store, k, fp("a"), lease)
	for _, bad := range []string{"", "not-the-token", idempotency.NewToken()} {
		if err := s.Store.Complete(t.Context(), k, bad, sampleResponse(), ttl); !errors.Is(err, idempotency.ErrLockLost) {
			t.Errorf("Complete with token %q: %v, want ErrLockLost", bad, err)
		}
		if err := s.Store.Release(t.Context(), k, bad); !errors.Is(err, idempotency.ErrLockLost) {
			t.Errorf("Release with token %q: %v, want ErrLockLost", bad, err)
		}
	}
	wantState(t, begin(t, s.Store, k, fp("a"), lease), idempotency.StateInFlight)
	// Another key's token does not work here either.
	other := acquire(t, s.Store, key(t, "other"), fp("a"), lease)
	if err := s.Store.Complete(t.Context(), k, other, sampleResponse(), ttl); !errors.Is(err, idempotency.ErrLockLost) {
		t.Errorf("Complete with another key's token: %v, want ErrLockLost", err)
	}

	complete(t, s.Store, k, tok, sampleResponse(), ttl)
	// Once completed, the token is spent.
	if err := s.Store.Complete(t.Context(), k, tok, &idempotency.Response{Status: 418}, ttl); !errors.Is(err, idempotency.ErrLockLost) {
		t.Errorf("second Complete: %v, want ErrLockLost", err)
	}
	if err := s.Store.Release(t.Context(), k, tok); !errors.Is(err, idempotency.ErrLockLost) {
		t.Errorf("Release after Complete: %v, want ErrLockLost", err)
	}
	res := begin(t, s.Store, k, fp("a"), lease)
	wantState(t, res, idempotency.StateCompleted)
	sameResponse(t, res.Response, sampleResponse())
}

func testIndependentKeys(t *testing.T, s Subject) {
	a, b := key(t, "a"), key(t, "b")
	ta := acquire(t, s.Store, a, fp("x"), lease)
	tb := acquire(t, s.Store, b, fp("y"), lease)
	complete(t, s.Store, a, ta, sampleResponse(), ttl)
	wantState(t, begin(t, s.Store, b, fp("y"), lease), idempotency.StateInFlight)
	if err := s.Store.Release(t.Context(), b, tb); err != nil {
		t.Fatal(err)
	}
	wantState(t, begin(t, s.Store, a, fp("x"), lease), idempotency.StateCompleted)
}

func testCanceledContext(t *testing.T, s Subject) {
	k := key(t, "k")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Store.Begin(ctx, k, fp("a"), lease); !errors.Is(err, context.Canceled) {
		t.Fatalf("Begin with a canceled context: %v, want context.Canceled", err)
	}
	// No lock was taken.
	tok := acquire(t, s.Store, k, fp("a"), lease)
	if err := s.Store.Complete(ctx, k, tok, sampleResponse(), ttl); !errors.Is(err, context.Canceled) {
		t.Fatalf("Complete with a canceled context: %v, want context.Canceled", err)
	}
	if err := s.Store.Release(ctx, k, tok); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with a canceled context: %v, want context.Canceled", err)
	}
	wantState(t, begin(t, s.Store, k, fp("a"), lease), idempotency.StateInFlight)
}

// testMiddlewareLeaseExpiry: a holder that is stuck (as good as dead to the
// other instances) frees the key after its lease; its late completion
// cannot overwrite the answer of the request that took over.
func testMiddlewareLeaseExpiry(t *testing.T, s Subject) {
	const leaseFor = 5 * time.Second
	var runs atomic.Int32
	stuck := make(chan struct{})
	entered := make(chan struct{})
	h := idempotency.Middleware(s.Store, idempotency.Config{Lease: leaseFor, Logger: discardLogger()})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			if n == 1 {
				close(entered)
				<-stuck
			}
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("run " + strconv.Itoa(int(n))))
		}))
	do := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/pay", bytes.NewReader([]byte(`{"amount":10}`)))
		req.Header.Set(idempotency.HeaderKey, `"lease-key"`)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- do() }()
	<-entered

	if rec := do(); rec.Code != http.StatusConflict || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("while held: %d Retry-After %q, want 409 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
	}
	s.Advance(leaseFor + time.Second)
	rec := do()
	if rec.Code != http.StatusCreated || rec.Body.String() != "run 2" {
		t.Fatalf("after the lease: %d %q, want 201 \"run 2\"", rec.Code, rec.Body)
	}
	close(stuck)
	if rec := <-first; rec.Code != http.StatusCreated {
		t.Errorf("stuck holder got %d, want its own 201", rec.Code)
	}
	rec = do()
	if got, want := rec.Body.String(), "run 2"; got != want || rec.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Errorf("replay = %q (replayed %q), want %q: the late holder must not overwrite", got, rec.Header().Get(idempotency.HeaderReplayed), want)
	}
	if got, want := runs.Load(), int32(2); got != want {
		t.Errorf("handler ran %d times, want %d", got, want)
	}
}
