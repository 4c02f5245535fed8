package bulkhead_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/bulkhead"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func wantCounts(t *testing.T, b *bulkhead.Bulkhead, inFlight, waiting int) {
	t.Helper()
	if got1, got2 := b.InFlight(), b.Waiting(); got1 != inFlight || got2 != waiting {
		t.Fatalf("in flight %d, waiting %d; want %d and %d", got1, got2, inFlight, waiting)
	}
}

func mustAcquire(t *testing.T, b *bulkhead.Bulkhead) *bulkhead.Slot {
	t.Helper()
	slot, err := b.Acquire(context.Background())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return &slot
}

// mustNew is bulkhead.New for configurations the test knows are valid.
func mustNew(cfg bulkhead.Config) *bulkhead.Bulkhead {
	b, err := bulkhead.New(cfg)
	if err != nil {
		panic(err)
	}
	return b
}

func TestDefaults(t *testing.T) {
	b := mustNew(bulkhead.Config{})
	if got := b.Limit(); got != bulkhead.DefaultMaxConcurrent {
		t.Fatalf("Limit = %d, want %d", got, bulkhead.DefaultMaxConcurrent)
	}
	var releases []*bulkhead.Slot
	for range bulkhead.DefaultMaxConcurrent {
		releases = append(releases, mustAcquire(t, b))
	}
	// No queue by default: the next caller is rejected at once.
	if _, err := b.Acquire(context.Background()); err != bulkhead.ErrFull {
		t.Fatalf("Acquire when full = %v, want ErrFull", err)
	}
	wantCounts(t, b, bulkhead.DefaultMaxConcurrent, 0)
	for _, r := range releases {
		r.Release()
	}
	wantCounts(t, b, 0, 0)
}

// Many goroutines, limit 5: never more than 5 calls at once, and every
// caller eventually gets through the queue.
func TestLimitRespectedUnderConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, callers = 5, 100
		b := mustNew(bulkhead.Config{MaxConcurrent: limit, MaxQueue: callers, MaxWait: time.Hour})
		var now, peak, done atomic.Int64
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				release, err := b.Acquire(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				n := now.Add(1)
				for m := peak.Load(); n > m && !peak.CompareAndSwap(m, n); m = peak.Load() {
				}
				time.Sleep(10 * time.Millisecond)
				now.Add(-1)
				done.Add(1)
				release.Release()
			})
		}
		wg.Wait()
		if peak.Load() != limit || done.Load() != callers {
			t.Fatalf("peak %d calls at once, %d done; want %d and %d", peak.Load(), done.Load(), limit, callers)
		}
		wantCounts(t, b, 0, 0)
	})
}

func TestQueueBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(bulkhead.Config{MaxConcurrent: 2, MaxQueue: 3, MaxWait: time.Hour})
		r1, r2 := mustAcquire(t, b), mustAcquire(t, b)
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				release, err := b.Acquire(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				release.Release()
			})
		}
		synctest.Wait()
		wantCounts(t, b, 2, 3)
		start := time.Now()
		if _, err := b.Acquire(context.Background()); err != bulkhead.ErrFull {
			t.Fatalf("Acquire with the queue full = %v, want ErrFull", err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("rejection waited %v, want at once", waited)
		}
		wantCounts(t, b, 2, 3)
		r1.Release()
		r2.Release()
		wg.Wait()
		wantCounts(t, b, 0, 0)
	})
}

func TestMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(bulkhead.Config{MaxConcurrent: 1, MaxQueue: 1, MaxWait: 100 * time.Millisecond})
		release := mustAcquire(t, b)
		start := time.Now()
		if _, err := b.Acquire(context.Background()); err != bulkhead.ErrFull {
			t.Fatalf("Acquire = %v, want ErrFull", err)
		}
		if waited := time.Since(start); waited != 100*time.Millisecond {
			t.Fatalf("waited %v, want MaxWait", waited)
		}
		wantCounts(t, b, 1, 0)
		release.Release()
		wantCounts(t, b, 0, 0)
	})
}

// The wait ends at min(MaxWait, deadline): never past the caller's deadline.
func TestWaitBoundedByDeadline(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxWait  time.Duration
		deadline time.Duration
		wantErr  error
		want     time.Duration
	}{
		{"deadline first", time.Second, 30 * time.Millisecond, context.DeadlineExceeded, 30 * time.Millisecond},
		{"MaxWait first", 100 * time.Millisecond, 2 * time.Second, bulkhead.ErrFull, 100 * time.Millisecond},
		{"default MaxWait", 0, time.Hour, bulkhead.ErrFull, bulkhead.DefaultMaxWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := mustNew(bulkhead.Config{MaxConcurrent: 1, MaxQueue: 1, MaxWait: tc.maxWait})
				release := mustAcquire(t, b)
				defer release.Release()
				ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
				defer cancel()
				start := time.Now()
				_, err := b.Acquire(ctx)
				if err != tc.wantErr {
					t.Fatalf("Acquire = %v, want %v", err, tc.wantErr)
				}
				if waited := time.Since(start); waited != tc.want {
					t.Fatalf("waited %v, want %v", waited, tc.want)
				}
				wantCounts(t, b, 1, 0)
			})
		})
	}
}

func TestDoneContextFailsAtOnce(t *testing.T) {
	b := mustNew(bulkhead.Config{MaxQueue: 10})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Acquire(ctx); err != context.Canceled {
		t.Fatalf("Acquire with a cancelled context = %v, want context.Canceled", err)
	}
	wantCounts(t, b, 0, 0)
}

// Waiters are served in arrival order, and one that gives up leaves the
// others' order and the counts exact.
func TestFIFOAndCancelWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 6
		b := mustNew(bulkhead.Config{MaxConcurrent: 1, MaxQueue: n, MaxWait: time.Hour})
		hold := mustAcquire(t, b)

		var mu sync.Mutex
		var order []int
		cancels := make([]context.CancelFunc, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			ctx, cancel := context.WithCancel(context.Background())
			cancels[i] = cancel
			wg.Go(func() {
				release, err := b.Acquire(ctx)
				errs[i] = err
				if err != nil {
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				release.Release()
			})
			synctest.Wait() // queued before the next one arrives
		}
		wantCounts(t, b, 1, n)

		cancels[2]()
		cancels[4]()
		synctest.Wait()
		wantCounts(t, b, 1, n-2)
		if errs[2] != context.Canceled || errs[4] != context.Canceled {
			t.Fatalf("cancelled waiters got %v and %v", errs[2], errs[4])
		}

		// A newcomer does not overtake the queue even when a slot frees.
		hold.Release()
		late, err := b.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		late.Release()
		wg.Wait()
		for _, c := range cancels {
			c()
		}
		if got, want := order, []int{0, 1, 3, 5}; !equal(got, want) {
			t.Fatalf("served in order %v, want %v", got, want)
		}
		wantCounts(t, b, 0, 0)
	})
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A waiter whose deadline falls at the very instant its slot is handed
// over must not leak the slot, whichever wins.
func TestGiveUpRacingReleaseDoesNotLeak(t *testing.T) {
	for range 200 {
		synctest.Test(t, func(t *testing.T) {
			b := mustNew(bulkhead.Config{MaxConcurrent: 1, MaxQueue: 2, MaxWait: 10 * time.Millisecond})
			hold := mustAcquire(t, b)
			time.AfterFunc(10*time.Millisecond, hold.Release) // the same instant as MaxWait
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			defer cancel()
			var wg sync.WaitGroup
			for _, c := range []context.Context{context.Background(), ctx} {
				wg.Go(func() {
					if release, err := b.Acquire(c); err == nil {
						release.Release()
					} else if err != bulkhead.ErrFull && !errors.Is(err, context.DeadlineExceeded) {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			synctest.Wait() // the AfterFunc's release, if it ran last
			wantCounts(t, b, 0, 0)
		})
	}
}

// Stress on the real clock, for the race detector: random short waits and
// cancellations; the limit holds and nothing leaks.
func TestStress(t *testing.T) {
	const limit = 3
	b := mustNew(bulkhead.Config{MaxConcurrent: limit, MaxQueue: 4, MaxWait: 200 * time.Microsecond})
	var now, peak atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration((w+i)%5)*50*time.Microsecond)
				release, err := b.Acquire(ctx)
				cancel()
				if err != nil {
					continue
				}
				n := now.Add(1)
				for m := peak.Load(); n > m && !peak.CompareAndSwap(m, n); m = peak.Load() {
				}
				if i%7 == 0 {
					time.Sleep(time.Microsecond)
				}
				now.Add(-1)
				release.Release()
			}
		})
	}
	wg.Wait()
	if peak.Load() > limit {
		t.Fatalf("%d in flight at once, limit %d", peak.Load(), limit)
	}
	wantCounts(t, b, 0, 0)
}

// A second Release of a Slot, and the Release of the zero Slot, do
// nothing: an early release plus a deferred one must not free another
// caller's slot.
func TestReleaseTwiceIsANoOp(t *testing.T) {
	b := mustNew(bulkhead.Config{MaxConcurrent: 1})
	first := mustAcquire(t, b)
	first.Release()
	second := mustAcquire(t, b)
	first.Release() // the deferred release of the first caller
	if _, err := b.Acquire(context.Background()); err != bulkhead.ErrFull {
		t.Fatalf("third Acquire = %v with one slot held by the second caller; want ErrFull", err)
	}
	wantCounts(t, b, 1, 0)
	second.Release()
	second.Release()
	var zero bulkhead.Slot
	zero.Release()
	wantCounts(t, b, 0, 0)
}

// Callers that release early and again in a defer never take the
// bulkhead past its limit. Before Release was idempotent, each second
// release freed a slot someone else held and the peak went past the limit.
func TestEarlyAndDeferredReleaseKeepTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, callers = 3, 50
		b := mustNew(bulkhead.Config{MaxConcurrent: limit, MaxQueue: callers, MaxWait: time.Hour})
		var now, peak atomic.Int64
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				slot, err := b.Acquire(context.Background())
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				defer slot.Release()
				n := now.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Duration(1+i%3) * time.Millisecond)
				now.Add(-1)
				slot.Release() // early: the work is done, the defer runs later
				time.Sleep(time.Millisecond)
			})
		}
		wg.Wait()
		if p := peak.Load(); p > limit {
			t.Fatalf("%d calls in flight at once, limit %d", p, limit)
		}
		wantCounts(t, b, 0, 0)
	})
}

// New rejects what no field allows, naming the field; a negative MaxWait
// means no limit.
func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		cfg  bulkhead.Config
		want string
	}{
		{bulkhead.Config{MaxConcurrent: -1}, "bulkhead: Config.MaxConcurrent is -1; want 1 to 4294967295, or zero for the default"},
		{bulkhead.Config{MaxConcurrent: 1 << 32}, "bulkhead: Config.MaxConcurrent is 4294967296; want 1 to 4294967295, or zero for the default"},
		{bulkhead.Config{MaxQueue: -1}, "bulkhead: Config.MaxQueue is -1; want 0 to 4294967295"},
		{bulkhead.Config{MaxConcurrent: -2, MaxQueue: -3}, "bulkhead: Config.MaxConcurrent is -2; want 1 to 4294967295, or zero for the default\n" +
			"bulkhead: Config.MaxQueue is -3; want 0 to 4294967295"},
	} {
		b, err := bulkhead.New(tc.cfg)
		if b != nil || !errors.Is(err, bulkhead.ErrInvalidConfig) || err.Error() != tc.want {
			t.Errorf("New(%+v) = %v, %v\nwant nil, %s", tc.cfg, b, err, tc.want)
		}
	}
}

// MaxWait negative: a waiter waits until its context ends, not 1 s.
func TestNegativeMaxWaitMeansNoLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(bulkhead.Config{MaxConcurrent: 1, MaxQueue: 1, MaxWait: -1})
		held := mustAcquire(t, b)
		time.AfterFunc(time.Hour, held.Release)
		start := time.Now()
		slot, err := b.Acquire(context.Background())
		if err != nil || time.Since(start) != time.Hour {
			t.Fatalf("Acquire = %v after %v; want a slot after 1h", err, time.Since(start))
		}
		slot.Release()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		held = mustAcquire(t, b)
		defer held.Release()
		start = time.Now()
		if _, err := b.Acquire(ctx); err != context.DeadlineExceeded || time.Since(start) != time.Minute {
			t.Fatalf("Acquire = %v after %v; want the context's deadline after 1m", err, time.Since(start))
		}
	})
}

func TestUncontendedDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage counters change allocation counts")
	}
	b := mustNew(bulkhead.Config{MaxQueue: 10})
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if n := testing.AllocsPerRun(1000, func() {
		release, err := b.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		release.Release()
	}); n != 0 {
		t.Fatalf("%v allocs per acquire and release, want 0", n)
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	b.Run("seq", func(b *testing.B) {
		bh := mustNew(bulkhead.Config{MaxConcurrent: 100})
		b.ReportAllocs()
		for b.Loop() {
			release, _ := bh.Acquire(ctx)
			release.Release()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		bh := mustNew(bulkhead.Config{MaxConcurrent: 100})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				release, _ := bh.Acquire(ctx)
				release.Release()
			}
		})
	})
	// Contended: 2 slots, 2 goroutines per P hammering, a queue to wait in.
	b.Run("contended", func(b *testing.B) {
		bh := mustNew(bulkhead.Config{MaxConcurrent: 1, MaxQueue: 64, MaxWait: time.Hour})
		b.ReportAllocs()
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				release, err := bh.Acquire(ctx)
				if err == nil {
					release.Release()
				}
			}
		})
	})
}

// AcquireBy never waits for a slot the caller would have no time to use.
func TestAcquireBy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		latest  time.Duration // from now; 0 = none
		maxWait time.Duration
		wantErr error
		want    time.Duration
	}{
		{"latest passed: at once", -time.Millisecond, time.Second, bulkhead.ErrNoTime, 0},
		{"latest now: at once", 0, time.Second, bulkhead.ErrNoTime, 0},
		{"latest first", 30 * time.Millisecond, time.Second, bulkhead.ErrNoTime, 30 * time.Millisecond},
		{"MaxWait first", time.Second, 100 * time.Millisecond, bulkhead.ErrFull, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := mustNew(bulkhead.Config{MaxConcurrent: 1, MaxQueue: 1, MaxWait: tc.maxWait})
				release := mustAcquire(t, b)
				defer release.Release()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				start := time.Now()
				_, err := b.AcquireBy(ctx, start.Add(tc.latest))
				if err != tc.wantErr || !errors.Is(err, bulkhead.ErrFull) {
					t.Fatalf("AcquireBy = %v, want %v (which Is ErrFull)", err, tc.wantErr)
				}
				if waited := time.Since(start); waited != tc.want {
					t.Fatalf("waited %v, want %v", waited, tc.want)
				}
				wantCounts(t, b, 1, 0)
			})
		})
	}
	// A free slot needs no time to wait for: granted even past latest.
	b := mustNew(bulkhead.Config{MaxQueue: 1})
	release, err := b.AcquireBy(context.Background(), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatalf("AcquireBy with a free slot = %v", err)
	}
	release.Release()
	if got := bulkhead.ErrNoTime.Error(); got != "bulkhead: full, no slot in the time left" {
		t.Fatalf("ErrNoTime = %q", got)
	}
}

// A waiter handed its slot at the instant its latest time passes takes it.
func TestAcquireByRacingRelease(t *testing.T) {
	for range 100 {
		synctest.Test(t, func(t *testing.T) {
			b := mustNew(bulkhead.Config{MaxConcurrent: 1, MaxQueue: 1, MaxWait: time.Hour})
			hold := mustAcquire(t, b)
			time.AfterFunc(10*time.Millisecond, hold.Release)
			if release, err := b.AcquireBy(context.Background(), time.Now().Add(10*time.Millisecond)); err == nil {
				release.Release()
			} else if err != bulkhead.ErrNoTime {
				t.Fatal(err)
			}
			synctest.Wait()
			wantCounts(t, b, 0, 0)
		})
	}
}

func TestGroupKeepsOneCompartmentPerKeyAndDropsIdleOnes(t *testing.T) {
	g, err := bulkhead.NewGroup(bulkhead.GroupConfig{Config: bulkhead.Config{MaxConcurrent: 1}, MaxKeys: 2})
	if err != nil {
		t.Fatal(err)
	}
	a := g.Get("a")
	if g.Get("a") != a {
		t.Fatal("a second Get of a key returned another compartment")
	}
	slot, err := a.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b := g.Get("b")
	_ = g.Get("c") // past 2 keys: idle b is dropped, busy a is kept
	if g.Get("a") != a {
		t.Error("the busy compartment of a was dropped")
	}
	if g.Get("b") == b {
		t.Error("the idle compartment of b was kept past the maximum")
	}
	slot.Release()
	if allocs := testing.AllocsPerRun(100, func() { g.Get("a") }); allocs != 0 {
		t.Errorf("Get of an existing key: %v allocations, want 0", allocs)
	}
}

func TestNewGroupValidates(t *testing.T) {
	if _, err := bulkhead.NewGroup(bulkhead.GroupConfig{Config: bulkhead.Config{MaxConcurrent: -1}}); !errors.Is(err, bulkhead.ErrInvalidConfig) {
		t.Errorf("bad Config: err = %v, want ErrInvalidConfig", err)
	}
	if _, err := bulkhead.NewGroup(bulkhead.GroupConfig{Config: bulkhead.Config{}, MaxKeys: -1}); !errors.Is(err, bulkhead.ErrInvalidConfig) || !strings.Contains(err.Error(), "MaxKeys is -1") {
		t.Errorf("negative MaxKeys: err = %v, want ErrInvalidConfig naming MaxKeys", err)
	}
	// Every invalid field is named, not only the first.
	_, err := bulkhead.NewGroup(bulkhead.GroupConfig{Config: bulkhead.Config{MaxConcurrent: -1}, MaxKeys: -1})
	want := "bulkhead: GroupConfig.Config.MaxConcurrent is -1; want 1 to 4294967295, or zero for the default\n" +
		"bulkhead: GroupConfig.MaxKeys is -1; want 0 (the default, 1000) or more"
	if !errors.Is(err, bulkhead.ErrInvalidConfig) || err.Error() != want {
		t.Errorf("two invalid fields: err = %v\nwant %s", err, want)
	}
}
