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
		{"ExtendKeepsTheLock", testExtend},
		{"ExtendWhenNotHeld", testExtendNotHeld},
		{"ExtendTakeoverRace", testExtendRace},
		{"IndependentKeys", testIndependentKeys},
		{"CanceledContext", testCanceledContext},
		{"MiddlewareLeaseExpiry", testMiddlewareLeaseExpiry},
		{"ScopeQuota", testScopeQuota},
		{"ScopeQuotaUnderContention", testScopeQuotaUnderContention},
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

func extend(t *testing.T, s idempotency.Store, k, tok string, l time.Duration) {
	t.Helper()
	if err := s.Extend(t.Context(), k, tok, l); err != nil {
		t.Fatalf("Extend: %v", err)
	}
}

func wantLost(t *testing.T, err error, what string) {
	t.Helper()
	if !errors.Is(err, idempotency.ErrLockLost) {
		t.Errorf("%s: %v, want ErrLockLost", what, err)
	}
}

// wantReplay begins k again and wants the sample response stored under it.
func wantReplay(t *testing.T, s idempotency.Store, k string, f idempotency.Fingerprint) {
	t.Helper()
	res := begin(t, s, k, f, lease)
	wantState(t, res, idempotency.StateCompleted)
	sameResponse(t, res.Response, sampleResponse())
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
		wantReplay(t, s.Store, k, fp("a"))
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
	wantReplay(t, s.Store, k, fp("a"))
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
	wantReplay(t, s.Store, k, fp("a"))

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
	wantReplay(t, s.Store, k, fp("a"))
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
	if err := s.Store.Extend(ctx, k, tok, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Extend with a canceled context: %v, want context.Canceled", err)
	}
	wantState(t, begin(t, s.Store, k, fp("a"), lease), idempotency.StateInFlight)
}

// testExtend: a holder that renews its lease before it ends keeps the key
// well past its first lease, and still completes it; Extend sets the lease
// to end lease from now, whatever was left.
func testExtend(t *testing.T, s Subject) {
	const short = 2 * time.Second
	k := key(t, "k")
	tok := acquire(t, s.Store, k, fp("a"), short)
	for range 3 {
		s.Advance(short * 3 / 4)
		extend(t, s.Store, k, tok, short)
	}
	s.Advance(short * 3 / 4) // 3 s after the lock, whose first lease was 2 s
	res := begin(t, s.Store, k, fp("a"), lease)
	wantState(t, res, idempotency.StateInFlight)
	if left := short / 4; res.RetryIn <= 0 || res.RetryIn > left+100*time.Millisecond {
		t.Errorf("RetryIn = %v, want the renewed lease's %v", res.RetryIn, left)
	}
	complete(t, s.Store, k, tok, sampleResponse(), ttl)
	wantReplay(t, s.Store, k, fp("a"))

	// A longer lease than the first, then a shorter one: each is counted
	// from the renewal.
	k2 := key(t, "k2")
	tok = acquire(t, s.Store, k2, fp("a"), short)
	extend(t, s.Store, k2, tok, time.Minute)
	s.Advance(30 * time.Second)
	res = begin(t, s.Store, k2, fp("a"), lease)
	wantState(t, res, idempotency.StateInFlight)
	if res.RetryIn <= 29*time.Second || res.RetryIn > 30*time.Second+100*time.Millisecond {
		t.Errorf("RetryIn = %v 30s after renewing for 1m, want about 30s", res.RetryIn)
	}
	extend(t, s.Store, k2, tok, short)
	s.Advance(short + 100*time.Millisecond)
	// The renewed lease ended: the key is free, the old holder is out.
	acquire(t, s.Store, k2, fp("b"), lease)
	wantLost(t, s.Store.Extend(t.Context(), k2, tok, time.Minute), "Extend after the renewed lease ended")
}

// testExtendNotHeld: Extend refuses every token that does not hold a live
// lock, and changes nothing: it neither lengthens another holder's lease,
// nor revives an ended or released lock, nor touches a stored response.
func testExtendNotHeld(t *testing.T, s Subject) {
	const short = 2 * time.Second
	k := key(t, "k")
	tok := acquire(t, s.Store, k, fp("a"), short)
	other := acquire(t, s.Store, key(t, "other"), fp("a"), lease)
	for _, bad := range []string{"", "not-the-token", idempotency.NewToken(), other} {
		wantLost(t, s.Store.Extend(t.Context(), k, bad, time.Hour), "Extend with token "+strconv.Quote(bad))
	}
	// The refused calls left the lease as it was: it ends on time.
	s.Advance(short + 100*time.Millisecond)
	// Ended, nobody took the key over yet: the holder cannot revive it.
	wantLost(t, s.Store.Extend(t.Context(), k, tok, time.Hour), "Extend after the lease ended")
	next := acquire(t, s.Store, k, fp("b"), lease)
	// Taken over: the old holder cannot renew the new lock; its holder can.
	wantLost(t, s.Store.Extend(t.Context(), k, tok, time.Hour), "Extend after a takeover")
	extend(t, s.Store, k, next, lease)

	// Completed: the token is spent, and the response's TTL is untouched,
	// neither cut to the lease nor lengthened.
	complete(t, s.Store, k, next, sampleResponse(), short)
	wantLost(t, s.Store.Extend(t.Context(), k, next, time.Millisecond), "Extend after Complete")
	s.Advance(10 * time.Millisecond)
	wantReplay(t, s.Store, k, fp("b"))
	wantLost(t, s.Store.Extend(t.Context(), k, next, time.Hour), "Extend after Complete")
	s.Advance(short)
	acquire(t, s.Store, k, fp("c"), lease) // the TTL ended on time

	// Released: nothing to renew, and the key stays free.
	k2 := key(t, "released")
	tok = acquire(t, s.Store, k2, fp("a"), lease)
	if err := s.Store.Release(t.Context(), k2, tok); err != nil {
		t.Fatal(err)
	}
	wantLost(t, s.Store.Extend(t.Context(), k2, tok, time.Hour), "Extend after Release")
	acquire(t, s.Store, k2, fp("b"), lease)
}

// testExtendRace: the holder renews while its lease ends and contenders
// try to take the key over, all at once. Whatever the order, one of them
// holds the key afterwards: the holder (its renewal succeeded, nobody
// acquired) or exactly one contender (the renewal was refused).
func testExtendRace(t *testing.T, s Subject) {
	const (
		rounds      = 8
		contenders  = 10
		short       = 2 * time.Second
		renewed     = 10 * short // outlives the Advance below
		contenderLn = 10 * short
	)
	for round := range rounds {
		k := key(t, "k"+strconv.Itoa(round))
		tok := acquire(t, s.Store, k, fp("a"), short)
		// Even rounds end the lease during the race; odd rounds end it
		// just before, so the renewal must lose.
		endedBefore := round%2 == 1
		if endedBefore {
			s.Advance(short)
		}
		var (
			wg        sync.WaitGroup
			start     = make(chan struct{})
			extendErr error
			mu        sync.Mutex
			winners   []string
		)
		if !endedBefore {
			wg.Go(func() { <-start; s.Advance(short) })
		}
		wg.Go(func() { <-start; extendErr = s.Store.Extend(context.Background(), k, tok, renewed) })
		for range contenders {
			wg.Go(func() {
				<-start
				res, err := s.Store.Begin(context.Background(), k, fp("a"), contenderLn)
				switch {
				case err != nil:
					t.Errorf("Begin: %v", err)
				case res.State == idempotency.StateAcquired:
					mu.Lock()
					winners = append(winners, res.Token)
					mu.Unlock()
				case res.State != idempotency.StateInFlight:
					t.Errorf("Begin state = %v, want acquired or in flight", res.State)
				}
			})
		}
		close(start)
		wg.Wait()

		switch {
		case extendErr == nil:
			if endedBefore {
				t.Fatalf("round %d: Extend revived a lease that had ended", round)
			}
			if len(winners) != 0 {
				t.Fatalf("round %d: the holder renewed its lease and %d contenders acquired the key too", round, len(winners))
			}
			wantState(t, begin(t, s.Store, k, fp("a"), lease), idempotency.StateInFlight)
			complete(t, s.Store, k, tok, sampleResponse(), ttl)
		case errors.Is(extendErr, idempotency.ErrLockLost):
			if len(winners) > 1 {
				t.Fatalf("round %d: %d contenders acquired the key at once", round, len(winners))
			}
			if endedBefore && len(winners) != 1 {
				t.Fatalf("round %d: %d contenders acquired a key whose lease had ended, want 1", round, len(winners))
			}
			if len(winners) == 0 { // every Begin ran before the lease ended
				winners = append(winners, acquire(t, s.Store, k, fp("a"), lease))
			}
			wantLost(t, s.Store.Complete(t.Context(), k, tok, sampleResponse(), ttl), "Complete by the holder that lost the race")
			complete(t, s.Store, k, winners[0], sampleResponse(), ttl)
		default:
			t.Fatalf("round %d: Extend: %v", round, extendErr)
		}
		res := begin(t, s.Store, k, fp("a"), lease)
		wantState(t, res, idempotency.StateCompleted)
	}
}

// testMiddlewareLeaseExpiry: a holder that stops renewing its lease (as
// good as dead to the other instances: here renewal is off) frees the key
// after its lease; its late completion cannot overwrite the answer of the
// request that took over.
func testMiddlewareLeaseExpiry(t *testing.T, s Subject) {
	const leaseFor = 5 * time.Second
	var runs atomic.Int32
	stuck := make(chan struct{})
	entered := make(chan struct{})
	h := middleware(s.Store, idempotency.Config{Lease: leaseFor, DisableLeaseRenewal: true, Logger: discardLogger()})(
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
