package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/fleet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memStore is a TokenStore in memory, on the test's clock: what a Redis
// script does, without Redis.
type memStore struct {
	mu      sync.Mutex
	buckets map[string]*memBucket
	fail    error // every call fails with it, when set
	hang    bool  // every call blocks until its context ends
	takes   int
	returns int
	keys    map[string]bool // every key seen
}

type memBucket struct {
	tokens float64
	at     time.Time
}

func newMemStore() *memStore {
	return &memStore{buckets: map[string]*memBucket{}, keys: map[string]bool{}}
}

func (m *memStore) bucket(key string, rate float64, burst int) *memBucket {
	b := m.buckets[key]
	now := time.Now()
	if b == nil {
		b = &memBucket{tokens: float64(burst), at: now}
		m.buckets[key] = b
	}
	b.tokens = min(b.tokens+now.Sub(b.at).Seconds()*rate, float64(burst))
	b.at = now
	m.keys[key] = true
	return b
}

func (m *memStore) call(ctx context.Context) error {
	m.mu.Lock()
	hang, fail := m.hang, m.fail
	m.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return fail
}

func (m *memStore) Take(ctx context.Context, key string, want int, rate float64, burst int) (int, time.Duration, error) {
	if err := m.call(ctx); err != nil {
		m.mu.Lock()
		m.takes++
		m.mu.Unlock()
		return 0, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.takes++
	b := m.bucket(key, rate, burst)
	got := min(want, int(math.Floor(b.tokens)))
	b.tokens -= float64(got)
	if b.tokens < 1 {
		return got, time.Duration(math.Ceil((1 - b.tokens) / rate * 1e9)), nil
	}
	return got, 0, nil
}

func (m *memStore) Return(ctx context.Context, key string, n int, rate float64, burst int) error {
	if err := m.call(ctx); err != nil {
		m.mu.Lock()
		m.returns++
		m.mu.Unlock()
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.returns++
	b := m.bucket(key, rate, burst)
	b.tokens = min(b.tokens+float64(n), float64(burst))
	return nil
}

func (m *memStore) set(fail error, hang bool) {
	m.mu.Lock()
	m.fail, m.hang = fail, hang
	m.mu.Unlock()
}

func (m *memStore) tokens(key string, rate float64, burst int) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bucket(key, rate, burst).tokens
}

func (m *memStore) calls() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.takes + m.returns
}

func newLimiter(t *testing.T, cfg fleet.LimiterConfig) *fleet.Limiter {
	t.Helper()
	l, err := fleet.NewLimiter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLimiterConfigErrors(t *testing.T) {
	_, err := fleet.NewLimiter(fleet.LimiterConfig{
		Rate: math.NaN(), Burst: -1, Lease: -time.Second, MaxLease: -2,
		StoreTimeout: -1, ProbeInterval: -1, OnStoreFailure: 7, MaxKeys: -3,
	})
	if !errors.Is(err, fleet.ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
	for _, field := range []string{"Store", "Rate", "Burst", "Lease", "MaxLease", "StoreTimeout", "ProbeInterval", "OnStoreFailure", "MaxKeys"} {
		if !strings.Contains(err.Error(), "fleet: LimiterConfig."+field+" is ") {
			t.Errorf("the error does not name %s:\n%v", field, err)
		}
	}
	if _, err := fleet.NewLimiter(fleet.LimiterConfig{Rate: math.Inf(1), Store: newMemStore()}); !errors.Is(err, fleet.ErrInvalidConfig) {
		t.Errorf("Rate +Inf: err = %v", err)
	}
	l, err := fleet.NewLimiter(fleet.LimiterConfig{Store: newMemStore()})
	if err != nil {
		t.Fatalf("a config with only a Store: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// load offers rps requests a second to l for d, evenly, and returns how
// many were admitted, how many refused, and every refusal's error that is
// not a *LimitedError with a RetryAfter above zero.
func load(l *fleet.Limiter, key string, rps float64, d time.Duration) (admitted, refused int, bad []error) {
	start := time.Now()
	sent := 0
	for time.Since(start) < d {
		due := int(time.Since(start).Seconds() * rps)
		for ; sent < due; sent++ {
			err := l.Allow(context.Background(), key)
			var le *fleet.LimitedError
			switch {
			case err == nil:
				admitted++
			case errors.As(err, &le) && le.RetryAfter > 0:
				refused++
			default:
				bad = append(bad, err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	return admitted, refused, bad
}

// One process under its limit admits everything, paying a round trip for
// a small share of its requests.
func TestLimiterUnderLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		l := newLimiter(t, fleet.LimiterConfig{Store: st, Rate: 1000, Burst: 100})
		defer l.Close()
		admitted, refused, bad := load(l, "k", 800, 10*time.Second)
		if refused != 0 || len(bad) != 0 || admitted < 7990 {
			t.Fatalf("admitted %d, refused %d, bad %v; want all 8000 admitted", admitted, refused, bad)
		}
		if s := l.Stats(); float64(s.Takes+s.Returns)/float64(admitted) > 0.1 {
			t.Errorf("%d takes and %d returns for %d admitted requests: above 0.1 a request", s.Takes, s.Returns, admitted)
		}
	})
}

// Eight processes offer three times the limit, one of them half of it:
// the fleet admits the limit, within 5% over 10 s, at no more than 0.1
// round trips per admitted request.
func TestLimiterFleetShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		const rate, burst = 1000, 200
		offered := []float64{1500, 1500.0 / 7, 1500.0 / 7, 1500.0 / 7, 1500.0 / 7, 1500.0 / 7, 1500.0 / 7, 1500.0 / 7}
		lims := make([]*fleet.Limiter, len(offered))
		for i := range lims {
			lims[i] = newLimiter(t, fleet.LimiterConfig{Store: st, Rate: rate, Burst: burst, Members: fleet.Fixed(len(offered))})
		}
		// Spend the initial burst first, so the window counts the rate.
		for st.tokens("k", rate, burst) >= 1 {
			_, _, _ = st.Take(context.Background(), "k", burst, rate, burst)
		}
		drained := st.calls()
		var wg sync.WaitGroup
		admitted := make([]int, len(lims))
		for i, l := range lims {
			wg.Go(func() {
				var bad []error
				admitted[i], _, bad = load(l, "k", offered[i], 10*time.Second)
				if len(bad) > 0 {
					t.Errorf("process %d: %v", i, bad[0])
				}
			})
		}
		wg.Wait()
		total, calls := 0, 0
		for i, l := range lims {
			total += admitted[i]
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			s := l.Stats()
			calls += int(s.Takes + s.Returns)
		}
		if total < 9500 || total > 10500 {
			t.Errorf("admitted %d in 10 s, want 10000 ± 5%% (per process %v)", total, admitted)
		}
		// The busiest process offers half the load: it gets a share of
		// the same order.
		if share := float64(admitted[0]) / float64(total); share < 0.3 || share > 0.7 {
			t.Errorf("the process offering half the load got %.0f%% of the admissions", share*100)
		}
		if float64(calls)/float64(total) > 0.1 {
			t.Errorf("%d store calls for %d admitted: %.3f a request, want at most 0.1", calls, total, float64(calls)/float64(total))
		}
		t.Logf("admitted %d (per process %v), %d store calls", total, admitted, calls)
		if st.calls()-drained != calls {
			t.Errorf("the store saw %d calls, the limiters counted %d", st.calls(), calls)
		}
	})
}

// A refusal's RetryAfter is never early: the same request, after it, is
// admitted.
func TestLimiterRetryAfterNotEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		l := newLimiter(t, fleet.LimiterConfig{Store: st, Rate: 10, Burst: 1})
		defer l.Close()
		ctx := context.Background()
		if err := l.Allow(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		for range 20 {
			err := l.Allow(ctx, "k")
			var le *fleet.LimitedError
			if !errors.As(err, &le) || !errors.Is(err, fleet.ErrLimited) {
				t.Fatalf("err = %v, want a LimitedError", err)
			}
			if le.RetryAfter <= 0 || le.Err != nil {
				t.Fatalf("RetryAfter %v, Err %v", le.RetryAfter, le.Err)
			}
			time.Sleep(le.RetryAfter)
			if err := l.Allow(ctx, "k"); err != nil {
				t.Fatalf("after RetryAfter %v: %v", le.RetryAfter, err)
			}
		}
	})
}

// Unspent tokens go back to the store when their lease ends.
func TestLimiterLeaseReturned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		const rate, burst = 1000, 1000
		l := newLimiter(t, fleet.LimiterConfig{Store: st, Rate: rate, Burst: burst})
		defer l.Close()
		_, _, _ = load(l, "k", 900, time.Second) // leases of about 90
		synctest.Wait()
		// The bucket refills at 1000/s and nothing is spent now: after a
		// lease and a half it is full again only if the lease came back.
		time.Sleep(40 * time.Millisecond)
		before := st.tokens("k", rate, burst)
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if got := st.tokens("k", rate, burst); got != burst {
			t.Errorf("bucket %.1f (%.1f before), want full %d: the lease was not given back", got, before, burst)
		}
		if s := l.Stats(); s.Returns == 0 {
			t.Errorf("no Return: %+v", s)
		}
	})
}

// A store that hangs costs a request at most StoreTimeout, once; then the
// limiter admits this process's share locally, probes the store in the
// background, and is exact again soon after the store answers.
func TestLimiterFailOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		const rate = 1000
		l := newLimiter(t, fleet.LimiterConfig{Store: st, Rate: rate, Burst: 100, Members: fleet.Fixed(4)})
		defer l.Close()
		ctx := context.Background()
		_, _, _ = load(l, "k", 500, time.Second)
		st.set(nil, true)
		// The first request without tokens waits for the store, at most
		// StoreTimeout.
		var slowest time.Duration
		start := time.Now()
		admitted := 0
		for time.Since(start) < 5*time.Second {
			t0 := time.Now()
			err := l.Allow(ctx, "k")
			slowest = max(slowest, time.Since(t0))
			if err == nil {
				admitted++
			}
			time.Sleep(time.Millisecond)
		}
		if slowest > fleet.DefaultStoreTimeout {
			t.Errorf("a request waited %v, want at most %v", slowest, fleet.DefaultStoreTimeout)
		}
		// 5 s at 1000/4 a second, less the first store timeout, plus the
		// lease held when the store failed.
		if admitted < 1150 || admitted > 1350 {
			t.Errorf("admitted %d in 5 s of failure, want about 1250 (the share 1000/4)", admitted)
		}
		s := l.Stats()
		if !s.Failing {
			t.Errorf("Stats.Failing is false during the failure")
		}
		calls := st.calls()
		// One probe every 200 ms: about 25 in 5 s.
		st.set(nil, false)
		recovered := time.Now()
		for l.Stats().Failing {
			_ = l.Allow(ctx, "k")
			time.Sleep(time.Millisecond)
			if time.Since(recovered) > time.Second {
				t.Fatalf("still failing 1 s after the store answered")
			}
		}
		if after := time.Since(recovered); after > fleet.DefaultProbeInterval+fleet.DefaultStoreTimeout {
			t.Errorf("recovered after %v, want within a probe interval", after)
		}
		if s.Takes > 40 || calls > 40 {
			t.Errorf("%d takes during a 5 s failure, want about 25 probes", s.Takes)
		}
		// Exact again: 2 s at 2000/s offered admits the rate.
		for st.tokens("k", rate, 100) >= 1 {
			_, _, _ = st.Take(ctx, "k", 100, rate, 100)
		}
		a, _, _ := load(l, "k", 2000, 2*time.Second)
		if a < 1900 || a > 2150 {
			t.Errorf("admitted %d in 2 s after recovery, want about 2000", a)
		}
	})
}

func TestLimiterFailClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		boom := errors.New("connection refused")
		st.set(boom, false)
		var mu sync.Mutex
		var seen []event.Event
		obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			mu.Lock()
			seen = append(seen, e)
			mu.Unlock()
			return ctx
		})
		l := newLimiter(t, fleet.LimiterConfig{Store: st, Rate: 100, OnStoreFailure: fleet.FailClosed, Name: "api", Observer: obs})
		defer l.Close()
		for i := range 100 {
			err := l.Allow(context.Background(), "k")
			var le *fleet.LimitedError
			if !errors.As(err, &le) || !errors.Is(err, boom) || le.RetryAfter < fleet.DefaultStoreTimeout {
				t.Fatalf("request %d: %v, want a refusal wrapping the store's error", i, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if s := l.Stats(); s.Admitted != 0 || s.Refused != 100 || !s.Failing {
			t.Errorf("stats %+v", s)
		}
		st.set(nil, false)
		time.Sleep(fleet.DefaultProbeInterval)
		_ = l.Allow(context.Background(), "k") // starts the probe
		synctest.Wait()
		if err := l.Allow(context.Background(), "k"); err != nil {
			t.Errorf("after the store came back: %v", err)
		}
		// One event when the store failed, one when it answered again.
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 2 || seen[0].Kind != event.SharedStore || seen[0].Outcome != event.OutcomeError || !errors.Is(seen[0].Err, boom) ||
			seen[0].Reason != event.ReasonFailClosed || seen[0].Dependency != "api" || seen[1].Outcome != event.OutcomeOK {
			t.Errorf("events %+v; want a failure then a recovery of api's store", seen)
		}
	})
}

// The table never holds more than MaxKeys keys, and forgotten keys give
// back their tokens; long keys are sent by their hash.
func TestLimiterMaxKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		const rate, burst = 100, 100
		l := newLimiter(t, fleet.LimiterConfig{Store: st, Rate: rate, Burst: burst, MaxLease: 10, MaxKeys: 64})
		ctx := context.Background()
		long := strings.Repeat("x", 1000)
		for i := range 1000 {
			key := long + string(rune('a'+i%26)) + string(rune('a'+i/26))
			for range 3 {
				if err := l.Allow(ctx, key); err != nil {
					t.Fatal(err)
				}
			}
		}
		synctest.Wait()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		for k := range st.keys {
			if len(k) > fleet.MaxKeyLen {
				t.Fatalf("key of %d bytes sent to the store", len(k))
			}
			// Every key spent 3 tokens; all the rest came back.
			if got := st.tokens(k, rate, burst); got < burst-3-0.001 {
				t.Fatalf("key %s holds %.1f tokens, want %d: a lease was lost", k, got, burst-3)
			}
		}
		if len(st.keys) != 1000 {
			t.Errorf("%d keys in the store, want 1000", len(st.keys))
		}
	})
}

func TestLimiterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		l := newLimiter(t, fleet.LimiterConfig{Store: st, Rate: 1000, Burst: 1000})
		_, _, _ = load(l, "k", 900, 500*time.Millisecond)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if got := st.tokens("k", 1000, 1000); got != 1000 {
			t.Errorf("after Close the bucket holds %.1f, want 1000: a lease was kept", got)
		}
		if err := l.Allow(context.Background(), "k"); !errors.Is(err, fleet.ErrClosed) {
			t.Errorf("Allow after Close: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}

// A caller whose context ends while it waits for the store gets the
// context's error, and does not mark the store as failing.
func TestLimiterContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		st.set(nil, true)
		l := newLimiter(t, fleet.LimiterConfig{Store: st, StoreTimeout: time.Second})
		defer l.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := l.Allow(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
		if l.Stats().Failing {
			t.Error("the caller's deadline marked the store as failing")
		}
	})
}

// The fast path: a key whose lease has tokens.
func BenchmarkAllow(b *testing.B) {
	l, err := fleet.NewLimiter(fleet.LimiterConfig{Store: newMemStore(), Rate: 1e9, Burst: 1e9, MaxLease: 1e6})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := l.Allow(ctx, "k"); err != nil {
				b.Fatal(err)
			}
		}
	})
	s := l.Stats()
	b.ReportMetric(float64(s.Takes+s.Returns)/float64(s.Admitted), "trips/op")
}

// grantStore grants every take and keeps nothing.
type grantStore struct{}

func (grantStore) Take(_ context.Context, _ string, want int, _ float64, _ int) (int, time.Duration, error) {
	return want, 0, nil
}
func (grantStore) Return(context.Context, string, int, float64, int) error { return nil }

// Each tracked key's memory, with keys of 16 bytes: the table holds
// MaxKeys of them however many come.
func TestLimiterMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	const keys = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l := newLimiter(t, fleet.LimiterConfig{Store: grantStore{}, Rate: 10, MaxKeys: keys})
	defer l.Close()
	for i := range 2 * keys {
		_ = l.Allow(context.Background(), fmt.Sprintf("client-%09d", i))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / keys
	t.Logf("%.0f bytes a key", per)
	if per > 400 {
		t.Errorf("%.0f bytes a key", per)
	}
}

// A bucket that refilled while the store failed (or a store that came
// back empty, with full buckets) does not add its burst to what FailOpen
// admitted meanwhile: the first take after the failure pays for the
// fallback's last admissions.
func TestLimiterFailOpenNoBurstOnReturn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		const rate, burst = 1000, 200
		l := newLimiter(t, fleet.LimiterConfig{Store: st, Rate: rate, Burst: burst})
		defer l.Close()
		_, _, _ = load(l, "k", 2000, time.Second)
		st.set(errors.New("down"), false)
		failed, _, _ := load(l, "k", 2000, 2*time.Second)
		if failed < 1800 || failed > 2100 {
			t.Fatalf("admitted %d in 2 s of failure, want about 2000 (Fixed(1): the whole rate)", failed)
		}
		st.set(nil, false) // the bucket is full: nobody took from it
		var a int
		for range 10 {
			n, _, _ := load(l, "k", 2000, 100*time.Millisecond)
			a += n
		}
		// 1 s at the rate, and no burst on top: at most a lease more.
		if a > 1000+100 || a < 850 {
			t.Errorf("admitted %d in the 1 s after the store came back, want about 1000, not 1000 + the burst of %d", a, burst)
		}
	})
}

// Rates far from the usual ones compute no overflowing wait: a refusal
// still says to retry after a positive duration.
func TestLimiterExtremeRates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, rate := range []float64{1e-300, 1e-9, 0.001, 1e300} {
			st := newMemStore()
			l := newLimiter(t, fleet.LimiterConfig{Store: st, Rate: rate, Burst: 1})
			ctx := context.Background()
			if err := l.Allow(ctx, "k"); err != nil {
				t.Fatalf("rate %g: first request: %v", rate, err)
			}
			err := l.Allow(ctx, "k")
			var le *fleet.LimitedError
			switch {
			case rate >= 1e300:
				// A token a femtosecond: the bucket is never empty for long.
			case !errors.As(err, &le) || le.RetryAfter <= 0:
				t.Errorf("rate %g: second request: %v, want a refusal with a positive RetryAfter", rate, err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Many goroutines of one process on one key admit no more than the
// bucket allows.
func TestLimiterConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		const rate, burst = 1000, 100
		l := newLimiter(t, fleet.LimiterConfig{Store: st, Rate: rate, Burst: burst})
		defer l.Close()
		var mu sync.Mutex
		total := 0
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				a, _, bad := load(l, "k", 200, 2*time.Second)
				if len(bad) > 0 {
					t.Error(bad[0])
				}
				mu.Lock()
				total += a
				mu.Unlock()
			})
		}
		wg.Wait()
		if max := 2*rate + burst; total > max || total < 2*rate*9/10 {
			t.Errorf("32 goroutines admitted %d in 2 s, want at most %d and about %d", total, max, 2*rate)
		}
	})
}

// view is one process's view of a shared memStore: it fails while the
// store is down, and after until its own time to see the store again.
type view struct {
	st    *memStore
	mu    sync.Mutex
	until time.Time
	down  bool
}

func (v *view) err() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.down || time.Now().Before(v.until) {
		return errors.New("down")
	}
	return nil
}

func (v *view) Take(ctx context.Context, key string, want int, rate float64, burst int) (int, time.Duration, error) {
	if err := v.err(); err != nil {
		return 0, 0, err
	}
	return v.st.Take(ctx, key, want, rate, burst)
}

func (v *view) Return(ctx context.Context, key string, n int, rate float64, burst int) error {
	if err := v.err(); err != nil {
		return err
	}
	return v.st.Return(ctx, key, n, rate, burst)
}

// The processes of a fleet see a store that came back (empty, with full
// buckets) at different times: those that see it first spend the bucket
// before the others pay for what their fallback admitted, and the others
// still pay, at their next takes. No 1 s window around the return admits
// more than the rate and a tenth, plus what the processes still failing
// admit on top of the shared bucket.
func TestLimiterFailOpenFleetReturnsApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		const n, rate, burst = 8, 1000, 200
		const spread = 40 * time.Millisecond // between one process's return and the next's
		var views []*view
		var lims []*fleet.Limiter
		for range n {
			v := &view{st: st}
			views = append(views, v)
			lims = append(lims, newLimiter(t, fleet.LimiterConfig{Store: v, Rate: rate, Burst: burst, Members: fleet.Fixed(n)}))
		}
		defer func() {
			for _, l := range lims {
				l.Close()
			}
		}()
		const slot = 100 * time.Millisecond
		start := time.Now()
		counts := make([]atomic.Int64, 100)
		var wg sync.WaitGroup
		for i, l := range lims {
			rps := 1500.0 / (n - 1)
			if i == 0 {
				rps = 1500 // half the load, and the first to see the store again
			}
			wg.Go(func() {
				sent := 0
				for time.Since(start) < 8*time.Second {
					due := int(time.Since(start).Seconds() * rps)
					for ; sent < due; sent++ {
						if l.Allow(context.Background(), "k") == nil {
							counts[time.Since(start)/slot].Add(1)
						}
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		time.Sleep(2 * time.Second)
		for _, v := range views {
			v.mu.Lock()
			v.down = true
			v.mu.Unlock()
		}
		time.Sleep(3 * time.Second)
		st.mu.Lock()
		st.buckets = map[string]*memBucket{} // restarted empty
		st.mu.Unlock()
		back := time.Now()
		for i, v := range views {
			v.mu.Lock()
			v.down, v.until = false, back.Add(time.Duration(i)*spread)
			v.mu.Unlock()
		}
		wg.Wait()
		from, to := int(back.Sub(start)/slot)-9, int(back.Sub(start)/slot)+20
		worst := 0
		for i := from; i <= to; i++ {
			sum := 0
			for j := i; j < i+10; j++ {
				sum += int(counts[j].Load())
			}
			worst = max(worst, sum)
		}
		// The processes still failing: the i-th admits its share (rate/n)
		// for i × spread on top of the bucket.
		overlap := 0.0
		for i := range n {
			overlap += rate / n * (time.Duration(i) * spread).Seconds()
		}
		t.Logf("worst 1 s window around the return: %d (the processes still failing: %.0f)", worst, overlap)
		if limit := rate*1.1 + overlap; float64(worst) > limit {
			t.Errorf("admitted %d in a 1 s window around the return, want at most %.0f: the rate, a tenth, and the %.0f the processes still failing admitted", worst, limit, overlap)
		}
	})
}
