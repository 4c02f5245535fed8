package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/ratelimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustNew(tb testing.TB, c ratelimit.Config) *ratelimit.Limiter {
	tb.Helper()
	l, err := ratelimit.New(c)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// headerKey charges requests to their X-Client header.
func headerKey(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil }

// served counts the requests that reached the handler, per client.
type served struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *served) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.n == nil {
		s.n = map[string]int{}
	}
	s.n[r.Header.Get("X-Client")]++
	s.mu.Unlock()
}

func send(h http.Handler, client string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Client", client)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  ratelimit.Config
		want string
	}{
		{ratelimit.Config{Rate: -1}, "ratelimit: Config.Rate is -1; want a finite number"},
		{ratelimit.Config{Rate: 1 / zero()}, "ratelimit: Config.Rate is +Inf"},
		{ratelimit.Config{Rate: zero() / zero()}, "ratelimit: Config.Rate is NaN"},
		{ratelimit.Config{Burst: -2}, "ratelimit: Config.Burst is -2; want a positive count"},
		{ratelimit.Config{MaxKeys: -1}, "ratelimit: Config.MaxKeys is -1; want a positive count"},
		{ratelimit.Config{IPv6PrefixBits: -1}, "ratelimit: Config.IPv6PrefixBits is -1; want a prefix length of 1 to 128 bits, or 0 for the default 64"},
		{ratelimit.Config{IPv6PrefixBits: 129}, "ratelimit: Config.IPv6PrefixBits is 129; want a prefix length of 1 to 128 bits"},
		// Every invalid field is named, not only the first.
		{ratelimit.Config{Rate: -1, Burst: -2, MaxKeys: -1}, "ratelimit: Config.Rate is -1; want a finite number of requests per second above 0, or 0 for the default 10\n" +
			"ratelimit: Config.Burst is -2; want a positive count, or 0 for Rate rounded up\n" +
			"ratelimit: Config.MaxKeys is -1; want a positive count"},
	} {
		_, err := ratelimit.New(tc.cfg)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errors.Is(err, ratelimit.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v; want an ErrInvalidConfig starting %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := ratelimit.New(ratelimit.Config{}); err != nil {
		t.Errorf("zero Config: %v", err)
	}
}

func zero() float64 { return 0 }

// An abusive client sending 100 times its rate gets its rate and no more,
// and a polite client on the same limiter gets every request through.
func TestAbusiveClientCannotTakeAnotherShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s served
		l := mustNew(t, ratelimit.Config{Key: headerKey, Rate: 10, Burst: 10})
		h := l.Middleware(&s)
		refused := map[string]int{}
		const seconds = 10
		for ms := range seconds * 1000 {
			if w := send(h, "abuser"); w.Code == http.StatusTooManyRequests {
				refused["abuser"]++
			}
			if ms%200 == 0 { // 5 per second, under the limit
				if w := send(h, "polite"); w.Code != http.StatusOK {
					t.Fatalf("polite client refused at %d ms: %d", ms, w.Code)
				}
			}
			time.Sleep(time.Millisecond)
		}
		// The abuser's burst plus 10 per second, to within the last token.
		if got, lo, hi := s.n["abuser"], 10+10*seconds-1, 10+10*seconds+1; got < lo || got > hi {
			t.Errorf("abuser admitted %d; want %d..%d", got, lo, hi)
		}
		if got := refused["abuser"] + s.n["abuser"]; got != seconds*1000 {
			t.Errorf("abuser sent %d; want %d", got, seconds*1000)
		}
		if got := s.n["polite"]; got != 5*seconds {
			t.Errorf("polite admitted %d; want %d", got, 5*seconds)
		}
	})
}

// Retry-After is whole seconds, at least 1, and never early: the request
// retried when it says is admitted.
func TestRetryAfterNeverZeroNeverEarly(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
	}{
		{0.1, 1}, {0.3, 2}, {0.5, 1}, {1, 1}, {1, 5}, {3, 3}, {7, 1}, {10, 10}, {1000, 1}, {1e6, 50},
	} {
		t.Run(fmt.Sprint(tc.rate, "/", tc.burst), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := mustNew(t, ratelimit.Config{Key: headerKey, Rate: tc.rate, Burst: tc.burst})
				h := l.Middleware(http.NotFoundHandler())
				for round := range 20 {
					var w *httptest.ResponseRecorder
					for { // spend the bucket
						if w = send(h, "c"); w.Code == http.StatusTooManyRequests {
							break
						}
					}
					secs, err := strconv.Atoi(w.Header().Get("Retry-After"))
					if err != nil || secs < 1 {
						t.Fatalf("round %d: Retry-After %q; want a whole number of seconds, at least 1", round, w.Header().Get("Retry-After"))
					}
					if want := max(1, int(1/tc.rate+0.999999)); secs > want+1 {
						t.Errorf("round %d: Retry-After %d; want about %d", round, secs, want)
					}
					time.Sleep(time.Duration(secs) * time.Second)
					if w := send(h, "c"); w.Code != http.StatusNotFound {
						t.Fatalf("round %d: retried after Retry-After %d s: %d; want admitted", round, secs, w.Code)
					}
					// Move off the whole second so the rounds cover fractions.
					time.Sleep(time.Duration(round) * 37 * time.Millisecond)
				}
			})
		})
	}
}

// A refusal costs the client nothing: refused requests do not push its
// next admission later.
func TestRefusalDoesNotSpendTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, ratelimit.Config{Rate: 1, Burst: 1})
		if err := l.Allow("k"); err != nil {
			t.Fatal(err)
		}
		for range 1000 {
			var le *ratelimit.LimitedError
			if err := l.Allow("k"); !errors.As(err, &le) || !errors.Is(err, ratelimit.ErrLimited) || le.RetryAfter != time.Second {
				t.Fatalf("Allow = %v; want a LimitedError retrying after 1s", err)
			}
		}
		time.Sleep(time.Second)
		if err := l.Allow("k"); err != nil {
			t.Errorf("after 1s: %v; want admitted", err)
		}
	})
}

func TestKeyErrorAndEmptyKey(t *testing.T) {
	var events []event.Event
	obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		events = append(events, e)
		return ctx
	})
	errNoKey := errors.New("no API key")
	var s served
	l := mustNew(t, ratelimit.Config{
		Name: "api", Rate: 1, Burst: 1, Observer: obs,
		Key: func(r *http.Request) (string, error) {
			if r.Header.Get("X-Broken") != "" {
				return "", errNoKey
			}
			return r.Header.Get("X-Client"), nil
		},
	})
	h := l.Middleware(&s)

	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Broken", "1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest || len(s.n) != 0 {
		t.Errorf("key error: %d, handler ran %d times; want 400 and no handler", w.Code, len(s.n))
	}
	// Two anonymous clients share the "" bucket: the second is refused.
	if c := send(h, "").Code; c != http.StatusOK {
		t.Errorf("first anonymous: %d", c)
	}
	if c := send(h, "").Code; c != http.StatusTooManyRequests {
		t.Errorf("second anonymous: %d; want 429 (one shared bucket)", c)
	}
	if c := send(h, "alice").Code; c != http.StatusOK {
		t.Errorf("alice: %d", c)
	}
	if len(events) != 2 {
		t.Fatalf("events %+v; want the key error and the refusal", events)
	}
	for i, e := range events {
		if e.Kind != event.Shed || e.Reason != event.ReasonRateLimit || e.Dependency != "api" {
			t.Errorf("event %d: %+v; want a shed event of api with reason rate_limit", i, e)
		}
	}
	if events[0].Err != errNoKey || events[1].Err != nil || events[1].Delay != time.Second {
		t.Errorf("events %+v; want the key error first, then a refusal with Delay 1s", events)
	}
}

// Keys idle long enough for their bucket to refill leave the table;
// nothing is lost, because a returning key starts with a full bucket.
func TestIdleKeysEvicted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, ratelimit.Config{Rate: 10, Burst: 20}) // refills in 2 s
		for i := range 1000 {
			l.Allow("idle-" + strconv.Itoa(i))
		}
		if n := ratelimit.Len(l); n != 1000 {
			t.Fatalf("Len = %d; want 1000", n)
		}
		time.Sleep(1900 * time.Millisecond)
		for i := range 1000 {
			l.Allow("busy-" + strconv.Itoa(i%10))
		}
		if n := ratelimit.Len(l); n != 1010 {
			t.Fatalf("before the refill time: Len = %d; want 1010 (nothing evicted)", n)
		}
		time.Sleep(200 * time.Millisecond)
		// Each request sweeps its own shard: new keys, so that every shard
		// sees requests (about 150 each, each sweeping two keys).
		for i := range 10_000 {
			l.Allow("new-" + strconv.Itoa(i))
		}
		if n := ratelimit.Len(l); n != 10_010 {
			t.Errorf("after the refill time: Len = %d; want 10010 (the idle keys swept, the busy ones kept)", n)
		}
	})
}

// Past MaxKeys a key in use stays, however many other keys arrive.
func TestMaxKeysKeepsRecent(t *testing.T) {
	l := mustNew(t, ratelimit.Config{Rate: 0.001, Burst: 1, MaxKeys: 1000})
	if err := l.Allow("hot"); err != nil {
		t.Fatal(err)
	}
	for i := range 100_000 {
		l.Allow("k" + strconv.Itoa(i))
		if i%10 == 0 {
			if err := l.Allow("hot"); err == nil {
				t.Fatalf("hot key admitted again after %d other keys: it lost its bucket", i)
			}
		}
		if n := ratelimit.Len(l); n > 1000 {
			t.Fatalf("Len = %d; want at most MaxKeys 1000", n)
		}
	}
}

// heapBound is the live heap a limiter with the default MaxKeys may hold,
// whatever it was sent; the documented figure is about 17 MB.
const heapBound = 24 << 20

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A million distinct keys leave the table at MaxKeys and the heap under
// the documented bound.
func TestMillionKeysBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("a million requests")
	}
	before := liveHeap()
	l := mustNew(t, ratelimit.Config{})
	var key [32]byte
	for i := range 1_000_000 {
		k := strconv.AppendInt(key[:0], int64(i), 10)
		l.Allow(string(k))
	}
	n := ratelimit.Len(l)
	grown := int64(liveHeap()) - int64(before)
	runtime.KeepAlive(l)
	t.Logf("1,000,000 keys: %d tracked, live heap grew %.1f MB (%.0f B per tracked key)", n, float64(grown)/(1<<20), float64(grown)/float64(n))
	if n > ratelimit.DefaultMaxKeys {
		t.Errorf("Len = %d; want at most %d", n, ratelimit.DefaultMaxKeys)
	}
	if grown > heapBound {
		t.Errorf("live heap grew %d B; want at most %d", grown, heapBound)
	}
}

// The limiter is exact under concurrency: 200 goroutines sharing one key
// get exactly its burst in one instant.
func TestConcurrentExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, ratelimit.Config{Rate: 1, Burst: 500})
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 200 {
			wg.Go(func() {
				for range 10 {
					if l.Allow("shared") == nil {
						admitted.Add(1)
					}
					l.Allow("own-" + strconv.Itoa(int(admitted.Load())))
				}
			})
		}
		wg.Wait()
		if got := admitted.Load(); got != 500 {
			t.Errorf("admitted %d of 2000 at once; want the burst, 500", got)
		}
	})
}

func TestDefaultKeyRemoteAddr(t *testing.T) {
	l := mustNew(t, ratelimit.Config{Rate: 1, Burst: 1})
	h := l.Middleware(http.NotFoundHandler())
	do := func(addr string) int {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if c := do("192.0.2.1:1234"); c != http.StatusNotFound {
		t.Errorf("first: %d", c)
	}
	if c := do("192.0.2.1:5678"); c != http.StatusTooManyRequests {
		t.Errorf("same host, other port: %d; want 429", c)
	}
	if c := do("[2001:db8::1]:80"); c != http.StatusNotFound {
		t.Errorf("other host: %d", c)
	}
	if c := do("garbage"); c != http.StatusNotFound {
		t.Errorf("not an address: %d; want admitted (the first of their shared bucket)", c)
	}
}

// A rate so low that the wait overflows a time.Duration still answers a
// positive Retry-After.
func TestTinyRateRetryAfterPositive(t *testing.T) {
	for _, r := range []float64{1e-300, 1e-12, 1e-6} {
		l := mustNew(t, ratelimit.Config{Rate: r, Burst: 1})
		l.Allow("k")
		var le *ratelimit.LimitedError
		if err := l.Allow("k"); !errors.As(err, &le) || le.RetryAfter < time.Second {
			t.Errorf("Rate %g: %v; want a positive Retry-After", r, err)
		}
		h := l.Middleware(http.NotFoundHandler())
		send(h, "")
		w := send(h, "")
		if n, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64); err != nil || n < 1 {
			t.Errorf("Rate %g: Retry-After %q", r, w.Header().Get("Retry-After"))
		}
	}
}
