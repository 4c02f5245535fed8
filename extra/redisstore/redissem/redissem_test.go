package redissem_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/extra/redisstore/internal/redistest"
	"github.com/guardrail-go/guardrail/extra/redisstore/redissem"
	"github.com/guardrail-go/guardrail/fleet"
)

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{}) // the failover test's dead node fills the log otherwise
	goleak.VerifyTestMain(m, goleak.Cleanup(redistest.StopShared),
		// go-redis's pool redials a server that refused its dials once a
		// second, and that goroutine sees a closed client only when it
		// wakes.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// harness is a Redis to run a test on: a client and a key prefix of the
// test's own, and what keys it left behind.
type harness struct {
	client redis.UniversalClient
	prefix string
	keys   func() []string
}

func standalone(t *testing.T) harness {
	c := redistest.NewClient(t, redistest.Addr(t), redis.Options{})
	prefix := redistest.Prefix(t, c)
	return harness{client: c, prefix: prefix, keys: func() []string {
		k, err := c.Keys(context.Background(), prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}}
}

func cluster(t *testing.T) harness {
	cc := redistest.Shared(t).Client(t)
	prefix, keys := redistest.ClusterPrefix(t, cc)
	return harness{client: cc, prefix: prefix, keys: keys}
}

func (h harness) store(t *testing.T) *redissem.Store {
	t.Helper()
	s, err := redissem.New(h.client, redissem.Config{Prefix: h.prefix})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newSem(t *testing.T, cfg fleet.SemaphoreConfig) *fleet.Semaphore {
	t.Helper()
	s, err := fleet.NewSemaphore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestNewRejects(t *testing.T) {
	_, err := redissem.New(nil, redissem.Config{Prefix: "a{b}:"})
	if !errors.Is(err, redissem.ErrInvalidConfig) || !strings.Contains(err.Error(), "client is nil") || !strings.Contains(err.Error(), "Config.Prefix") {
		t.Fatalf("New = %v; want ErrInvalidConfig naming the client and Config.Prefix", err)
	}
	store, err := redissem.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), redissem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Acquire(context.Background(), "a}b", 1, "h", time.Second); err == nil || !strings.Contains(err.Error(), "holds a }") {
		t.Fatalf("Acquire of a name with a } = %v; want it refused before any call", err)
	}
}

func TestStandalone(t *testing.T) { runAll(t, standalone) }
func TestCluster(t *testing.T)    { runAll(t, cluster) }

func runAll(t *testing.T, on func(*testing.T) harness) {
	t.Run("FIFO", func(t *testing.T) { testFIFO(t, on(t)) })
	t.Run("CrashedHolder", func(t *testing.T) { testCrashedHolder(t, on(t)) })
	t.Run("Notified", func(t *testing.T) { testNotified(t, on(t)) })
	t.Run("Renewed", func(t *testing.T) { testRenewed(t, on(t)) })
	t.Run("Bulkhead", func(t *testing.T) { testBulkhead(t, on(t)) })
}

// signalStore tells when a waiter first has its place in the queue. A
// waiter asks again while it waits; only its first answer counts, or a
// waiter already queued could stand in for the one the test waits on.
type signalStore struct {
	*redissem.Store
	queued chan struct{}
	mu     sync.Mutex
	seen   map[string]bool
}

func newSignalStore(store *redissem.Store) *signalStore {
	return &signalStore{Store: store, queued: make(chan struct{}, 8), seen: map[string]bool{}}
}

func (s *signalStore) Acquire(ctx context.Context, name string, limit int, holder string, ttl time.Duration) (fleet.SemaphoreState, error) {
	st, err := s.Store.Acquire(ctx, name, limit, holder, ttl)
	if err != nil || st.Held {
		return st, err
	}
	s.mu.Lock()
	first := !s.seen[holder]
	s.seen[holder] = true
	s.mu.Unlock()
	if first {
		s.queued <- struct{}{}
	}
	return st, err
}

// testFIFO: two processes, one slot, waiters served in arrival order, and
// nothing left in Redis once all is released.
func testFIFO(t *testing.T, h harness) {
	store := h.store(t)
	ctx := context.Background()
	// The store: positions in arrival order, grants in that order.
	if st, err := store.Acquire(ctx, "raw", 1, "h0", time.Minute); err != nil || !st.Held || st.InUse != 1 {
		t.Fatalf("Acquire h0 = %+v, %v; want held", st, err)
	}
	for i, w := range []string{"w0", "w1", "w2"} {
		st, err := store.Acquire(ctx, "raw", 1, w, time.Minute)
		if err != nil || st.Held || st.Position != i {
			t.Fatalf("Acquire %s = %+v, %v; want queued at position %d", w, st, err, i)
		}
	}
	if st, _ := store.Acquire(ctx, "raw", 1, "w1", time.Minute); st.Held || st.Position != 1 {
		t.Fatalf("asking again = %+v; want the same place, 1", st)
	}
	for i, w := range []string{"h0", "w0", "w1"} {
		if err := store.Release(ctx, "raw", 1, w, time.Minute); err != nil {
			t.Fatal(err)
		}
		next := []string{"w0", "w1", "w2"}[i]
		if st, _ := store.Acquire(ctx, "raw", 1, next, time.Minute); !st.Held {
			t.Fatalf("after %s's release, %s = %+v; want the slot handed to it", w, next, st)
		}
	}
	if err := store.Release(ctx, "raw", 1, "w2", time.Minute); err != nil {
		t.Fatal(err)
	}

	// Two processes' Semaphores.
	sig := newSignalStore(store)
	a := newSem(t, fleet.SemaphoreConfig{Store: sig, Name: "api", Limit: 1, MaxWait: -1})
	b := newSem(t, fleet.SemaphoreConfig{Store: sig, Name: "api", Limit: 1, MaxWait: -1})
	first, err := a.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan int, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		s := []*fleet.Semaphore{b, a}[i%2]
		wg.Go(func() {
			release, err := s.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			served <- i
			release()
		})
		<-sig.queued // in the queue before the next one comes
	}
	first()
	wg.Wait()
	close(served)
	var order []int
	for i := range served {
		order = append(order, i)
	}
	if len(order) != 4 || order[0] != 0 || order[1] != 1 || order[2] != 2 || order[3] != 3 {
		t.Fatalf("served %v; want arrival order [0 1 2 3]", order)
	}
	if n, err := store.InUse(ctx, "api"); err != nil || n != 0 {
		t.Fatalf("InUse = %d, %v; want 0", n, err)
	}
	if k := h.keys(); len(k) != 0 {
		t.Fatalf("keys left after every release: %v", k)
	}
}

// testCrashedHolder: a holder that never renews loses its slot when its
// lease ends, and a waiter gets it then.
func testCrashedHolder(t *testing.T, h harness) {
	store := h.store(t)
	const ttl = 300 * time.Millisecond
	ctx := context.Background()
	start := time.Now()
	if st, err := store.Acquire(ctx, "api", 1, "crashed", ttl); err != nil || !st.Held {
		t.Fatalf("Acquire = %+v, %v", st, err)
	}
	s := newSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 1, LeaseTTL: ttl, MaxWait: -1})
	release, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if d := time.Since(start); d < ttl-20*time.Millisecond || d > ttl+ttl/3+100*time.Millisecond {
		t.Fatalf("slot came back after %v; want about the lease, %v, plus at most a poll", d, ttl)
	}
	if lost, err := store.Renew(ctx, "api", 1, []string{"crashed"}, ttl); err != nil || len(lost) != 1 {
		t.Fatalf("Renew of the crashed holder = %v, %v; want it lost", lost, err)
	}
}

// testNotified: with a poll far longer than the test, a waiter still gets
// a released slot at once: the grant is published.
func testNotified(t *testing.T, h harness) {
	store := h.store(t)
	ctx := context.Background()
	sig := newSignalStore(store)
	a := newSem(t, fleet.SemaphoreConfig{Store: sig, Name: "api", Limit: 1, LeaseTTL: time.Minute, MaxWait: -1})
	b := newSem(t, fleet.SemaphoreConfig{Store: sig, Name: "api", Limit: 1, LeaseTTL: time.Minute, MaxWait: -1})
	release, err := a.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time)
	go func() {
		r, err := b.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- time.Now()
		r()
	}()
	<-sig.queued
	released := time.Now()
	release()
	if d := (<-got).Sub(released); d > 2*time.Second {
		t.Fatalf("waiter got the slot %v after the release; want at once (the poll is every 20s)", d)
	}
}

// testRenewed: a slot held for several leases stays held.
func testRenewed(t *testing.T, h harness) {
	store := h.store(t)
	ctx := context.Background()
	const ttl = 90 * time.Millisecond
	s := newSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 1, LeaseTTL: ttl})
	release, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	other := newSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 1, LeaseTTL: ttl, MaxWait: 5 * ttl})
	if _, err := other.Acquire(ctx); !errors.Is(err, fleet.ErrFull) {
		t.Fatalf("Acquire while held for 5 leases = %v; want ErrFull", err)
	}
}

// testBulkhead: the Semaphore behind a Bulkhead bounds two of them.
func testBulkhead(t *testing.T, h harness) {
	store := h.store(t)
	var mu sync.Mutex
	inFlight, peak := 0, 0
	var wg sync.WaitGroup
	for range 2 {
		sem := newSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 3, MaxWait: -1})
		bh, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 10, MaxWait: -1, Shared: sem})
		if err != nil {
			t.Fatal(err)
		}
		for range 8 {
			wg.Go(func() {
				for range 5 {
					slot, err := bh.Acquire(context.Background())
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					inFlight++
					peak = max(peak, inFlight)
					mu.Unlock()
					time.Sleep(2 * time.Millisecond) // the call
					mu.Lock()
					inFlight--
					mu.Unlock()
					slot.Release()
				}
			})
		}
	}
	wg.Wait()
	if peak > 3 {
		t.Fatalf("peak in flight %d; want at most the limit, 3", peak)
	}
}

// BenchmarkAcquireRelease is one Acquire and its release with a slot free:
// two scripts, two round trips.
func BenchmarkAcquireRelease(b *testing.B) {
	addr := redistest.Addr(b)
	c := redistest.NewClient(b, addr, redis.Options{})
	store, err := redissem.New(c, redissem.Config{Prefix: redistest.Prefix(b, c)})
	if err != nil {
		b.Fatal(err)
	}
	sem, err := fleet.NewSemaphore(fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 1000})
	if err != nil {
		b.Fatal(err)
	}
	defer sem.Close()
	ctx := context.Background()
	b.Run("seq", func(b *testing.B) {
		for b.Loop() {
			release, err := sem.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			release()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				release, err := sem.Acquire(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				release()
			}
		})
	})
}

// With Redis unreachable, FailOpen runs calls under this process's share
// of the limit and FailClosed refuses them.
func TestRedisUnreachable(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}) // nothing listens there
	defer client.Close()
	store, err := redissem.New(client, redissem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	open := newSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 8, OnStoreFailure: fleet.FailOpen, Members: fleet.Fixed(4)})
	r1, err1 := open.Acquire(ctx)
	r2, err2 := open.Acquire(ctx)
	_, err3 := open.Acquire(ctx)
	if err1 != nil || err2 != nil || err3 != fleet.ErrFull {
		t.Fatalf("FailOpen: %v, %v, %v; want two calls (8 / 4) and ErrFull", err1, err2, err3)
	}
	r1()
	r2()
	closed := newSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 8, OnStoreFailure: fleet.FailClosed})
	if _, err := closed.Acquire(ctx); !errors.Is(err, fleet.ErrStoreUnavailable) || !errors.Is(err, bulkhead.ErrFull) {
		t.Fatalf("FailClosed: %v; want ErrStoreUnavailable", err)
	}
}
