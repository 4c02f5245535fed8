package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

// logBuffer is a log destination safe for the renewal timer's goroutine.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// extendCounter counts the Extend calls that reach a store.
type extendCounter struct {
	idempotency.Store
	calls atomic.Int32
}

func (c *extendCounter) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	c.calls.Add(1)
	return c.Store.Extend(ctx, key, token, lease)
}

// A handler that runs for over three leases keeps its key: a retry that arrives
// after the first lease would have ended gets 409, the handler runs once,
// and its response is stored and replayed. With renewal off, the same
// retry takes the key over and runs the handler a second time.
func TestRenewalKeepsTheKeyOfASlowHandler(t *testing.T) {
	const (
		leaseFor = 3 * time.Second
		runFor   = 3*leaseFor + leaseFor/6 // off the renewal ticks, so their count is exact
	)
	for _, renew := range []bool{true, false} {
		name := "renewal on"
		if !renew {
			name = "renewal off"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &extendCounter{Store: must(memstore.New(memstore.Config{}))}
				var logs logBuffer
				ev := &events{}
				var runs atomic.Int32
				mw := middleware(store, idempotency.Config{
					Lease: leaseFor, DisableLeaseRenewal: !renew, Logger: logs.logger(), Observer: ev,
				})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n := runs.Add(1)
					if n == 1 {
						time.Sleep(runFor) // ignores any deadline; cannot be interrupted
					}
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, "charge "+string(rune('0'+n)))
				}))
				pay := request{key: "k", body: `{"amount":1}`}
				start := time.Now()
				first := make(chan string)
				go func() {
					rec := serve(mw, pay)
					first <- rec.Body.String()
				}()

				time.Sleep(leaseFor + time.Second) // the first lease would have ended
				retry := serve(mw, pay)
				if !renew {
					wantCode(t, retry, http.StatusCreated)
					if got := <-first; got != "charge 1" {
						t.Errorf("first response %q, want its own \"charge 1\"", got)
					}
					if got := serve(mw, pay).Body.String(); got != "charge 2" {
						t.Errorf("replay %q, want the second run's \"charge 2\"", got)
					}
					if n := runs.Load(); n != 2 {
						t.Errorf("handler ran %d times, want 2 (the lease ended, the retry took over)", n)
					}
					if n := store.calls.Load(); n != 0 {
						t.Errorf("%d renewals with renewal off", n)
					}
					if !strings.Contains(logs.String(), "turn lease renewal back on") {
						t.Errorf("log does not point at renewal:\n%s", logs.String())
					}
					return
				}
				wantCode(t, retry, http.StatusConflict)
				if got := retry.Header().Get("Retry-After"); got != "1" {
					t.Errorf("Retry-After = %q, want 1", got)
				}
				if got := <-first; got != "charge 1" {
					t.Errorf("first response %q, want \"charge 1\"", got)
				}
				if got, want := time.Since(start), runFor; got != want {
					t.Errorf("handler ran %v, want %v", got, want)
				}
				replay := serve(mw, pay)
				wantCode(t, replay, http.StatusCreated)
				if got := replay.Body.String(); got != "charge 1" || replay.Header().Get(idempotency.HeaderReplayed) != "true" {
					t.Errorf("replay %q (replayed %q), want the stored \"charge 1\"", got, replay.Header().Get(idempotency.HeaderReplayed))
				}
				if n := runs.Load(); n != 1 {
					t.Errorf("handler ran %d times, want 1", n)
				}
				// Every lease/3 while the 9.5 s handler ran: at 1 s, 2 s ... 9 s.
				if got, want := store.calls.Load(), int32(9); got != want {
					t.Errorf("%d renewals, want %d", got, want)
				}
				if ev.count(event.ReasonStored) != 1 || ev.count(event.ReasonStoreError) != 0 {
					t.Errorf("events %v, want one stored and no store error", ev.n)
				}
				if logs.String() != "" {
					t.Errorf("logged:\n%s", logs.String())
				}
				// Nothing renews once the request is over.
				time.Sleep(time.Minute)
				if got, want := store.calls.Load(), int32(9); got != want {
					t.Errorf("%d renewals a minute after the handler returned, want %d", got, want)
				}
			})
		})
	}
}

// extendCall is what a fake store's Extend saw.
type extendCall struct {
	at       time.Duration // since the request began
	lease    time.Duration
	deadline time.Duration // of its context, from the call
	err      error         // of its context, at the call
}

// extendLog is what a recording store saw of Extend: each call, timed
// from start, when the request began.
type extendLog struct {
	start time.Time
	mu    sync.Mutex
	calls []extendCall
}

// recordingStore acquires every key and records the Extend calls in l;
// extend decides each call's result (nil means success).
func recordingStore(l *extendLog, extend func(ctx context.Context, n int) error) *fakeStore {
	s := acquiring()
	s.extend = func(ctx context.Context, _, _ string, lease time.Duration) error {
		dl, _ := ctx.Deadline()
		l.mu.Lock()
		l.calls = append(l.calls, extendCall{at: time.Since(l.start), lease: lease, deadline: time.Until(dl), err: ctx.Err()})
		n := len(l.calls)
		l.mu.Unlock()
		if extend == nil {
			return nil
		}
		return extend(ctx, n)
	}
	return s
}

func sleeper(d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(d)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	})
}

// Renewals run every third of the lease, each with the lease Begin took,
// on a context that keeps the request's values but not its cancellation,
// bounded by StoreTimeout; a failed renewal is retried at the next tick.
func TestRenewalSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			ext  extendLog
			logs logBuffer
		)
		errDown := errors.New("store unreachable")
		s := recordingStore(&ext, func(_ context.Context, n int) error {
			if n == 2 {
				return errDown
			}
			return nil
		})
		ev := &events{}
		mw := middleware(s, idempotency.Config{
			Lease: 3 * time.Second, StoreTimeout: 500 * time.Millisecond, Logger: logs.logger(), Observer: ev,
		})(sleeper(6500 * time.Millisecond))
		// The client is gone from the start: the handler runs on, and so
		// must the renewals.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		ext.start = time.Now()
		wantCode(t, serve(mw, request{key: "k", ctx: ctx}), http.StatusCreated)

		if len(ext.calls) != 6 {
			t.Fatalf("%d renewals, want 6 (every 1s for 6.5s): %+v", len(ext.calls), ext.calls)
		}
		for i, c := range ext.calls {
			if want := time.Duration(i+1) * time.Second; c.at != want {
				t.Errorf("renewal %d at %v, want %v", i+1, c.at, want)
			}
			if c.lease != 3*time.Second {
				t.Errorf("renewal %d for %v, want the 3s lease", i+1, c.lease)
			}
			if c.deadline != 500*time.Millisecond || c.err != nil {
				t.Errorf("renewal %d context: deadline in %v, err %v; want 500ms (StoreTimeout), not canceled", i+1, c.deadline, c.err)
			}
		}
		if got := ev.count(event.ReasonStoreError); got != 1 {
			t.Errorf("%d store_error events, want 1", got)
		}
		out := logs.String()
		if strings.Count(out, "level=WARN") != 1 || !strings.Contains(out, "renewing the key's lease failed; trying again") ||
			!strings.Contains(out, "store unreachable") || strings.Contains(out, "level=ERROR") {
			t.Errorf("want one warning for the failed renewal, logged:\n%s", out)
		}
	})
}

// The lease follows the request's deadline when that is later, and so do
// the renewals.
func TestRenewalWithADeadlineLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ext extendLog
		s := recordingStore(&ext, nil)
		mw := middleware(s, idempotency.Config{Lease: 3 * time.Second, Logger: quiet()})(sleeper(time.Minute))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ext.start = time.Now()
		serve(mw, request{key: "k", ctx: ctx})
		const lease = 2*time.Minute + time.Second
		if len(ext.calls) != 1 || ext.calls[0].at != lease/3 || ext.calls[0].lease != lease {
			t.Errorf("renewals %+v, want one at %v for %v", ext.calls, lease/3, lease)
		}
	})
}

// Renewals that keep failing stop once no try fits before the lease ends,
// with an error saying what that means.
func TestRenewalGivesUpWhenTheLeaseEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			ext  extendLog
			logs logBuffer
		)
		s := recordingStore(&ext, func(context.Context, int) error {
			return errors.New("connection refused")
		})
		s.complete = func(context.Context, string, string, *idempotency.Response, time.Duration) error {
			return idempotency.ErrLockLost // what the store says once the lease ended
		}
		ev := &events{}
		mw := middleware(s, idempotency.Config{Lease: 3 * time.Second, Logger: logs.logger(), Observer: ev})(sleeper(10 * time.Second))
		ext.start = time.Now()
		rec := serve(mw, request{key: "k"})
		wantCode(t, rec, http.StatusCreated)
		if rec.Body.String() != "done" {
			t.Errorf("body %q, want the handler's", rec.Body)
		}
		if len(ext.calls) != 2 || ext.calls[0].at != time.Second || ext.calls[1].at != 2*time.Second {
			t.Errorf("renewals %+v, want two, at 1s and 2s (the next would be when the lease ends)", ext.calls)
		}
		out := logs.String()
		if strings.Count(out, "level=WARN") != 1 || strings.Count(out, "level=ERROR") != 2 ||
			!strings.Contains(out, "no renewal is left before it ends") ||
			!strings.Contains(out, "lease expired before the handler finished (its renewal failed") {
			t.Errorf("logged:\n%s", out)
		}
		if got := ev.count(event.ReasonStoreError); got != 3 {
			t.Errorf("%d store_error events, want 3 (two renewals, the completion)", got)
		}
	})
}

// A renewal that finds the lock lost stops renewing and says so at once;
// the handler cannot be interrupted, so it finishes and its client gets its
// response, which the store refuses to keep.
func TestRenewalFindsTheLockLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			ext  extendLog
			logs logBuffer
		)
		s := recordingStore(&ext, func(context.Context, int) error { return idempotency.ErrLockLost })
		var completed atomic.Bool
		s.complete = func(context.Context, string, string, *idempotency.Response, time.Duration) error {
			completed.Store(true)
			return idempotency.ErrLockLost
		}
		var lostLogged bool
		ev := &events{}
		mw := middleware(s, idempotency.Config{Lease: 3 * time.Second, Logger: logs.logger(), Observer: ev})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(1500 * time.Millisecond)
				lostLogged = strings.Contains(logs.String(), "lease was lost while the handler ran")
				time.Sleep(5 * time.Second)
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "charged")
			}))
		ext.start = time.Now()
		rec := serve(mw, request{key: "k"})
		wantCode(t, rec, http.StatusCreated)
		if rec.Body.String() != "charged" {
			t.Errorf("body %q, want the handler's", rec.Body)
		}
		if len(ext.calls) != 1 {
			t.Errorf("%d renewals, want 1: none after the lock was lost", len(ext.calls))
		}
		if !lostLogged {
			t.Error("the lost lock was not logged while the handler ran")
		}
		if !completed.Load() {
			t.Error("Complete not tried: the store decides")
		}
		if got := ev.count(event.ReasonStoreError); got != 2 {
			t.Errorf("%d store_error events, want 2 (the renewal, the completion)", got)
		}
	})
}

// A renewal in flight when the handler returns is cancelled and waited
// for: the request ends at once, nothing is logged for it, and the key is
// completed only after it returned.
func TestRenewalInFlightWhenTheHandlerReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			ext     extendLog
			logs    logBuffer
			stopped atomic.Bool
			cause   error
		)
		s := recordingStore(&ext, func(ctx context.Context, _ int) error {
			<-ctx.Done() // a store that hangs
			cause = ctx.Err()
			stopped.Store(true)
			return ctx.Err()
		})
		var completeAfterStop bool
		s.complete = func(context.Context, string, string, *idempotency.Response, time.Duration) error {
			completeAfterStop = stopped.Load()
			return nil
		}
		ev := &events{}
		mw := middleware(s, idempotency.Config{Lease: 3 * time.Second, Logger: logs.logger(), Observer: ev})(sleeper(1100 * time.Millisecond))
		ext.start = time.Now()
		wantCode(t, serve(mw, request{key: "k"}), http.StatusCreated)
		if got, want := time.Since(ext.start), 1100*time.Millisecond; got != want {
			t.Errorf("request took %v, want %v: the hung renewal must not delay it", got, want)
		}
		if !errors.Is(cause, context.Canceled) {
			t.Errorf("renewal ended with %v, want context.Canceled", cause)
		}
		if !completeAfterStop {
			t.Error("Complete ran while the renewal was still in flight")
		}
		if logs.String() != "" || ev.count(event.ReasonStoreError) != 0 {
			t.Errorf("an abandoned renewal was reported: events %v, logs:\n%s", ev.n, logs.String())
		}
		if ev.count(event.ReasonStored) != 1 {
			t.Errorf("events %v, want one stored", ev.n)
		}
	})
}

// A handler that panics stops the renewals before its key's outcome is
// recorded.
func TestRenewalStopsOnPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ext extendLog
		s := recordingStore(&ext, nil)
		var releasedAt int
		s.complete = func(context.Context, string, string, *idempotency.Response, time.Duration) error {
			ext.mu.Lock()
			releasedAt = len(ext.calls)
			ext.mu.Unlock()
			return nil
		}
		mw := middleware(s, idempotency.Config{Lease: 3 * time.Second, Logger: quiet()})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(2500 * time.Millisecond)
				panic("boom")
			}))
		ext.start = time.Now()
		func() {
			defer func() { recover() }()
			serve(mw, request{key: "k"})
		}()
		time.Sleep(time.Minute)
		if len(ext.calls) != 2 || releasedAt != 2 {
			t.Errorf("%d renewals, %d before the outcome was recorded; want 2 and 2", len(ext.calls), releasedAt)
		}
	})
}

// BenchmarkRenewal measures what renewal adds to a request whose handler
// finishes before the first renewal is due (arming and stopping its timer),
// on a store that costs nothing, next to the same request with renewal off.
func BenchmarkRenewal(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	for _, bm := range []struct {
		name string
		off  bool
	}{{"off", true}, {"on", false}} {
		b.Run(bm.name, func(b *testing.B) {
			mw := middleware(acquiring(), idempotency.Config{Logger: quiet(), DisableLeaseRenewal: bm.off})(h)
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, "/payments", nil)
				req.Header.Set(idempotency.HeaderKey, "k")
				mw.ServeHTTP(discardWriter{}, req)
			}
		})
	}
}

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (discardWriter) WriteHeader(int)             {}
