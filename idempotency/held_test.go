package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

// checks records what Held and Confirm said in a handler, at times since
// the request began (start), and what the store saw of Extend if it is a
// recording store (recordingStore(&c.extendLog, ...)).
type checks struct {
	extendLog
	gotMu sync.Mutex
	got   []string
}

func (c *checks) held(ctx context.Context)    { c.add("Held", idempotency.Held(ctx)) }
func (c *checks) confirm(ctx context.Context) { c.add("Confirm", idempotency.Confirm(ctx)) }

func (c *checks) add(what string, err error) {
	c.gotMu.Lock()
	defer c.gotMu.Unlock()
	c.got = append(c.got, fmt.Sprintf("%v %s: %s", time.Since(c.start), what, describe(err)))
}

// describe names the sentinels err matches.
func describe(err error) string {
	if err == nil {
		return "held"
	}
	var is []string
	for _, s := range []struct {
		err  error
		name string
	}{
		{idempotency.ErrLeaseLost, "ErrLeaseLost"},
		{idempotency.ErrLockLost, "ErrLockLost"},
		{idempotency.ErrNoLease, "ErrNoLease"},
		{context.DeadlineExceeded, "DeadlineExceeded"},
		{errDown, "errDown"},
	} {
		if errors.Is(err, s.err) {
			is = append(is, s.name)
		}
	}
	return strings.Join(is, "+")
}

func (c *checks) want(t *testing.T, want ...string) {
	t.Helper()
	c.gotMu.Lock()
	defer c.gotMu.Unlock()
	if strings.Join(c.got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(c.got, "\n"), strings.Join(want, "\n"))
	}
}

var errDown = errors.New("store unreachable")

// Held says the key is held all through a handler that runs for over three
// leases while renewals succeed, from several goroutines at once, right up
// to each renewal and past every end the lease had before it.
func TestHeldWhileRenewalsSucceed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &extendCounter{Store: must(memstore.New(memstore.Config{}))}
		var lost atomic.Int32
		mw := middleware(store, idempotency.Config{Lease: 3 * time.Second, Logger: quiet()})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var wg sync.WaitGroup
				for range 3 {
					wg.Go(func() {
						for range 100 { // every 99ms for 9.9s, off the renewal ticks
							if idempotency.Held(r.Context()) != nil {
								lost.Add(1)
							}
							time.Sleep(99 * time.Millisecond)
						}
					})
				}
				wg.Wait()
				w.WriteHeader(http.StatusCreated)
			}))
		wantCode(t, serve(mw, request{key: "k"}), http.StatusCreated)
		if n := lost.Load(); n != 0 {
			t.Errorf("Held reported the lease lost %d times", n)
		}
		if n := store.calls.Load(); n != 9 {
			t.Errorf("%d renewals, want 9", n)
		}
	})
}

// A renewal that finds the lock lost makes Held and Confirm report it at
// once and from then on; Confirm does not ask the store again.
func TestHeldAfterTheLockIsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c checks
		s := recordingStore(&c.extendLog, func(context.Context, int) error { return idempotency.ErrLockLost })
		mw := middleware(s, idempotency.Config{Lease: 3 * time.Second, Logger: quiet()})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(999 * time.Millisecond)
				c.held(r.Context())
				time.Sleep(time.Millisecond) // the renewal at 1s finds the lock lost
				synctest.Wait()
				c.held(r.Context())
				c.confirm(r.Context())
				time.Sleep(10 * time.Second)
				c.held(r.Context())
			}))
		c.start = time.Now()
		serve(mw, request{key: "k"})
		c.want(t,
			"999ms Held: held",
			"1s Held: ErrLeaseLost+ErrLockLost",
			"1s Confirm: ErrLeaseLost+ErrLockLost",
			"11s Held: ErrLeaseLost+ErrLockLost",
		)
		if len(c.calls) != 1 {
			t.Errorf("%d Extend c.calls, want the one renewal", len(c.calls))
		}
	})
}

// A renewal that fails does not lose the lease, the next one that succeeds
// keeps it; but when renewals fail until the lease's end, Held reports the
// lease lost from that very instant, with the store's error, and keeps
// doing so when the store is back: Confirm then does not try it.
func TestHeldWhenTheLeaseEndsDuringAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c checks
		// The renewal at 1s succeeds, so the lease ends at 4s; those at 2s
		// and 3s fail, and none fits after. The store is back by 5s.
		s := recordingStore(&c.extendLog, func(_ context.Context, n int) error {
			if n == 2 || n == 3 {
				return errDown
			}
			return nil
		})
		mw := middleware(s, idempotency.Config{Lease: 3 * time.Second, Logger: quiet()})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for _, at := range []time.Duration{2500 * time.Millisecond, 3999 * time.Millisecond, 4 * time.Second, 5 * time.Second} {
					time.Sleep(at - time.Since(c.start))
					c.held(r.Context())
				}
				c.confirm(r.Context())
			}))
		c.start = time.Now()
		serve(mw, request{key: "k"})
		c.want(t,
			"2.5s Held: held",
			"3.999s Held: held",
			"4s Held: ErrLeaseLost+errDown",
			"5s Held: ErrLeaseLost+errDown",
			"5s Confirm: ErrLeaseLost+errDown",
		)
		if len(c.calls) != 3 {
			t.Errorf("%d Extend c.calls, want 3: renewals at 1s, 2s and 3s, none after, and none by Confirm", len(c.calls))
		}
	})
}

// With renewal off the lease ends at its fixed end, and Held says so.
func TestHeldWithRenewalOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c checks
		store := &extendCounter{Store: must(memstore.New(memstore.Config{}))}
		mw := middleware(store, idempotency.Config{Lease: 3 * time.Second, DisableLeaseRenewal: true, Logger: quiet()})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(3*time.Second - time.Nanosecond)
				c.held(r.Context())
				time.Sleep(time.Nanosecond)
				c.held(r.Context())
				if err := idempotency.Held(r.Context()); !strings.Contains(err.Error(), "renewal is off") {
					t.Errorf("Held: %v, want it to say renewal is off", err)
				}
			}))
		c.start = time.Now()
		serve(mw, request{key: "k"})
		c.want(t,
			"2.999999999s Held: held",
			"3s Held: ErrLeaseLost",
		)
		if n := store.calls.Load(); n != 0 {
			t.Errorf("%d Extend calls with renewal off", n)
		}
	})
}

// Confirm extends the lease in the store: a handler that confirms before
// its fixed lease ends keeps its key past that end (a retry then gets
// 409), Held agrees, and its response is stored.
func TestConfirmExtendsTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			c    checks
			runs atomic.Int32
		)
		mw := middleware(must(memstore.New(memstore.Config{})), idempotency.Config{
			Lease: 3 * time.Second, DisableLeaseRenewal: true, Logger: quiet(),
		})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) > 1 {
				w.WriteHeader(http.StatusCreated)
				return
			}
			time.Sleep(2 * time.Second)
			c.confirm(r.Context())
			time.Sleep(2*time.Second + 999*time.Millisecond) // to just before 2s+3s
			c.held(r.Context())
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("charged"))
		}))
		pay := request{key: "k", body: `{"amount":1}`}
		c.start = time.Now()
		first := make(chan string)
		go func() { first <- serve(mw, pay).Body.String() }()

		time.Sleep(4 * time.Second) // past the lease Begin took
		wantCode(t, serve(mw, pay), http.StatusConflict)
		if got := <-first; got != "charged" {
			t.Errorf("first response %q", got)
		}
		if got := serve(mw, pay); got.Body.String() != "charged" || got.Header().Get(idempotency.HeaderReplayed) != "true" {
			t.Errorf("replay %d %q, want the stored \"charged\"", got.Code, got.Body)
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("handler ran %d times, want 1", n)
		}
		c.want(t,
			"2s Confirm: held",
			"4.999s Held: held",
		)
	})
}

// Confirm calls Store.Extend with the request's key, token and lease,
// bounded by StoreTimeout; a failed call leaves the lease as it was, and
// a call that finds the lock lost loses it.
func TestConfirmCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			c    checks
			keys []string
		)
		s := recordingStore(&c.extendLog, func(ctx context.Context, n int) error {
			switch n {
			case 1:
				<-ctx.Done() // a store that hangs
				return ctx.Err()
			case 2:
				return errDown
			case 3:
				return nil
			}
			return idempotency.ErrLockLost
		})
		extend := s.extend
		s.extend = func(ctx context.Context, key, token string, lease time.Duration) error {
			c.mu.Lock()
			keys = append(keys, key[:4]+" "+token)
			c.mu.Unlock()
			return extend(ctx, key, token, lease)
		}
		mw := middleware(s, idempotency.Config{
			Lease: 10 * time.Second, DisableLeaseRenewal: true, StoreTimeout: 500 * time.Millisecond, Logger: quiet(),
		})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for range 4 {
				time.Sleep(time.Second)
				c.confirm(r.Context())
				c.held(r.Context())
			}
		}))
		c.start = time.Now()
		serve(mw, request{key: "k"})
		c.want(t,
			"1.5s Confirm: DeadlineExceeded",
			"1.5s Held: held",
			"2.5s Confirm: errDown",
			"2.5s Held: held",
			"3.5s Confirm: held",
			"3.5s Held: held",
			"4.5s Confirm: ErrLeaseLost+ErrLockLost",
			"4.5s Held: ErrLeaseLost+ErrLockLost",
		)
		for i, call := range c.calls {
			if call.lease != 10*time.Second || call.deadline != 500*time.Millisecond {
				t.Errorf("Extend %d for %v with a deadline in %v, want 10s and 500ms", i+1, call.lease, call.deadline)
			}
		}
		for _, k := range keys {
			if k != keys[0] || !strings.HasSuffix(k, " t") {
				t.Errorf("Extend keys and tokens %q, want one key and the token \"t\"", keys)
				break
			}
		}
	})
}

// Confirm is bounded by its context: once the client has gone, the
// request's context fails it, and the same context without its
// cancellation still finds the lease.
func TestConfirmAfterTheClientWentAway(t *testing.T) {
	var canceled, detached error
	ctx, leave := context.WithCancel(context.Background())
	mw := middleware(must(memstore.New(memstore.Config{})), idempotency.Config{Logger: quiet()})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			leave() // the client goes away
			canceled = idempotency.Confirm(r.Context())
			detached = idempotency.Confirm(context.WithoutCancel(r.Context()))
			w.WriteHeader(http.StatusCreated)
		}))
	serve(mw, request{key: "k", ctx: ctx})
	if !errors.Is(canceled, context.Canceled) || errors.Is(canceled, idempotency.ErrLeaseLost) {
		t.Errorf("Confirm with the request's context: %v, want context.Canceled", canceled)
	}
	if detached != nil {
		t.Errorf("Confirm without its cancellation: %v, want nil", detached)
	}
}

// A Confirm that succeeds during an outage, after the renewals gave up,
// extends the lease and starts them again, a third of a lease after it.
func TestConfirmDuringAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c checks
		s := recordingStore(&c.extendLog, func(_ context.Context, n int) error {
			if n == 3 { // the Confirm
				return nil
			}
			return errDown
		})
		mw := middleware(s, idempotency.Config{Lease: 3 * time.Second, Logger: quiet()})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(2500 * time.Millisecond)
				c.confirm(r.Context())
				time.Sleep(2999 * time.Millisecond) // to just before 2.5s+3s
				c.held(r.Context())
				time.Sleep(time.Millisecond)
				c.held(r.Context())
			}))
		c.start = time.Now()
		serve(mw, request{key: "k"})
		c.want(t,
			"2.5s Confirm: held",
			"5.499s Held: held",
			"5.5s Held: ErrLeaseLost+errDown",
		)
		var at []time.Duration
		for _, call := range c.calls {
			at = append(at, call.at)
		}
		// Renewals at 1s and 2s fail, and the next would be at the
		// lease's end; the Confirm at 2.5s moves it to 5.5s, and the
		// renewals go on at 3.5s and 4.5s.
		if got, want := fmt.Sprint(at), "[1s 2s 2.5s 3.5s 4.5s]"; got != want {
			t.Errorf("Extend c.calls at %s, want %s", got, want)
		}
	})
}

// Held and Confirm report ErrNoLease outside a request the middleware
// handles, and nil for one it lets through unprotected (no key, or
// FailOpen), so that a handler needs no special case for those.
func TestNoLease(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  idempotency.Config
		rq   request
		want error
	}{
		{"method passed through", idempotency.Config{}, request{method: http.MethodGet, key: "k"}, idempotency.ErrNoLease},
		{"no key", idempotency.Config{}, request{}, nil},
		{"fail open", idempotency.Config{FailOpen: true}, request{key: "k"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := acquiring()
			s.begin = func(context.Context, string, idempotency.Fingerprint, time.Duration) (idempotency.Result, error) {
				return idempotency.Result{}, errDown
			}
			var held, confirmed error
			tt.cfg.Logger = quiet()
			mw := middleware(s, tt.cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				held, confirmed = idempotency.Held(r.Context()), idempotency.Confirm(r.Context())
			}))
			wantCode(t, serve(mw, tt.rq), http.StatusOK)
			if held != tt.want || confirmed != tt.want {
				t.Errorf("Held: %v, Confirm: %v; want %v", held, confirmed, tt.want)
			}
		})
	}
	if err := idempotency.Held(context.Background()); err != idempotency.ErrNoLease {
		t.Errorf("Held(context.Background()) = %v, want ErrNoLease", err)
	}
	if err := idempotency.Confirm(context.Background()); err != idempotency.ErrNoLease {
		t.Errorf("Confirm(context.Background()) = %v, want ErrNoLease", err)
	}
}

// Once the handler returned, its key is completed or released: a goroutine
// it left behind is told the lease is lost, and Confirm does not call the
// store.
func TestHeldAfterTheHandlerReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var extends atomic.Int32
		s := acquiring()
		s.extend = func(context.Context, string, string, time.Duration) error {
			extends.Add(1)
			return nil
		}
		var ctx context.Context
		mw := middleware(s, idempotency.Config{Logger: quiet()})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx = r.Context()
				w.WriteHeader(http.StatusCreated)
			}))
		wantCode(t, serve(mw, request{key: "k"}), http.StatusCreated)
		held, confirmed := idempotency.Held(ctx), idempotency.Confirm(ctx)
		if !errors.Is(held, idempotency.ErrLeaseLost) || !errors.Is(confirmed, idempotency.ErrLeaseLost) {
			t.Errorf("Held: %v, Confirm: %v; want ErrLeaseLost", held, confirmed)
		}
		if !strings.Contains(held.Error(), "handler has returned") {
			t.Errorf("Held: %v, want it to say the handler returned", held)
		}
		if n := extends.Load(); n != 0 {
			t.Errorf("%d Extend calls, want none", n)
		}
	})
}

// With CancelOnLeaseLost the handler's context is cancelled, with the
// loss as its cause, at the moment Held starts reporting it; a handler
// that then returns without writing has its key released. The context is
// left alone while the lease is held, and without the option.
func TestCancelOnLeaseLost(t *testing.T) {
	for _, tt := range []struct {
		name     string
		cfg      idempotency.Config
		extend   func(n int) error
		confirm  time.Duration // when the handler ext.calls Confirm; 0 means it does not
		wantAt   time.Duration // when the context is cancelled; 0 means not while the handler runs
		wantWhy  string        // its cause, as describe says; "held" when not cancelled
		wantCall string        // what the middleware does with the key
	}{{
		name:   "the lock is lost",
		cfg:    idempotency.Config{CancelOnLeaseLost: true},
		extend: func(int) error { return idempotency.ErrLockLost },
		wantAt: time.Second, wantWhy: "ErrLeaseLost+ErrLockLost", wantCall: "release",
	}, {
		name:   "renewals fail until the lease ends",
		cfg:    idempotency.Config{CancelOnLeaseLost: true},
		extend: func(n int) error { return errDown },
		wantAt: 3 * time.Second, wantWhy: "ErrLeaseLost+errDown", wantCall: "release",
	}, {
		name: "a renewal fails, the next succeeds",
		cfg:  idempotency.Config{CancelOnLeaseLost: true},
		extend: func(n int) error {
			if n == 2 {
				return errDown
			}
			return nil
		},
		wantWhy: "held", wantCall: "complete",
	}, {
		name:   "renewal off",
		cfg:    idempotency.Config{CancelOnLeaseLost: true, DisableLeaseRenewal: true},
		wantAt: 3 * time.Second, wantWhy: "ErrLeaseLost", wantCall: "release",
	}, {
		name:    "renewal off, confirmed",
		cfg:     idempotency.Config{CancelOnLeaseLost: true, DisableLeaseRenewal: true},
		confirm: 2 * time.Second,
		wantAt:  5 * time.Second, wantWhy: "ErrLeaseLost", wantCall: "release",
	}, {
		name:    "option off",
		cfg:     idempotency.Config{},
		extend:  func(int) error { return idempotency.ErrLockLost },
		wantWhy: "held", wantCall: "complete",
	}} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var (
					ext  extendLog
					done []string
				)
				s := recordingStore(&ext, func(_ context.Context, n int) error {
					if tt.extend == nil {
						return nil
					}
					return tt.extend(n)
				})
				s.complete = func(context.Context, string, string, *idempotency.Response, time.Duration) error {
					done = append(done, "complete")
					return nil
				}
				s.release = func(context.Context, string, string) error {
					done = append(done, "release")
					return nil
				}
				var (
					at  time.Duration
					why error
					ctx context.Context
				)
				tt.cfg.Lease = 3 * time.Second
				tt.cfg.Logger = quiet()
				mw := middleware(s, tt.cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					ctx = r.Context()
					if tt.confirm > 0 {
						time.Sleep(tt.confirm)
						if err := idempotency.Confirm(ctx); err != nil {
							t.Errorf("Confirm: %v", err)
						}
					}
					select {
					case <-ctx.Done():
						at, why = time.Since(ext.start), context.Cause(ctx)
						if held := idempotency.Held(ctx); held != why {
							t.Errorf("Held: %v, want the context's cause %v", held, why)
						}
						return // gives up, writing nothing
					case <-time.After(10*time.Second - time.Since(ext.start)):
						w.WriteHeader(http.StatusCreated)
					}
				}))
				ext.start = time.Now()
				serve(mw, request{key: "k"})
				if at != tt.wantAt || describe(why) != tt.wantWhy {
					t.Errorf("context cancelled at %v for %v (%s), want at %v for %s", at, why, describe(why), tt.wantAt, tt.wantWhy)
				}
				if fmt.Sprint(done) != "["+tt.wantCall+"]" {
					t.Errorf("the middleware called %v, want %s", done, tt.wantCall)
				}
				if tt.cfg.CancelOnLeaseLost && ctx.Err() == nil {
					t.Error("the handler's context is not cancelled once the request is over")
				}
			})
		})
	}
}

// With CancelOnLeaseLost, the log of the last failed renewal says that the
// handler's context will be cancelled, not that the handler goes on.
func TestCancelOnLeaseLostLogsTheCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			ext  extendLog
			logs logBuffer
		)
		s := recordingStore(&ext, func(context.Context, int) error { return errDown })
		s.release = func(context.Context, string, string) error { return nil }
		cfg := idempotency.Config{CancelOnLeaseLost: true, Lease: 3 * time.Second, Logger: logs.logger()}
		mw := middleware(s, cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		}))
		ext.start = time.Now()
		serve(mw, request{key: "k"})
		out := logs.String()
		if !strings.Contains(out, "no renewal is left before it ends; when it ends, the handler's context is cancelled") {
			t.Errorf("log: %s", out)
		}
		if strings.Contains(out, "while the handler still runs") {
			t.Errorf("log says the handler goes on: %s", out)
		}
	})
}
