package fleet_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/fleet"
)

func mustSem(t *testing.T, cfg fleet.SemaphoreConfig) *fleet.Semaphore {
	t.Helper()
	s, err := fleet.NewSemaphore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustTake(t *testing.T, s *fleet.Semaphore) func() {
	t.Helper()
	release, err := s.Acquire(context.Background())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return release
}

func TestSemaphoreConfigErrors(t *testing.T) {
	_, err := fleet.NewSemaphore(fleet.SemaphoreConfig{Limit: -1, LeaseTTL: time.Millisecond, OnStoreFailure: fleet.FailOpen})
	if !errors.Is(err, fleet.ErrInvalidConfig) {
		t.Fatalf("err = %v; want ErrInvalidConfig", err)
	}
	for _, field := range []string{"Store", "Name", "Limit", "LeaseTTL"} {
		if !strings.Contains(err.Error(), "SemaphoreConfig."+field+" is") {
			t.Errorf("error %q does not name SemaphoreConfig.%s", err, field)
		}
	}
	_, err = fleet.NewSemaphore(fleet.SemaphoreConfig{Store: new(fleet.MemorySemaphoreStore), Name: "x", LeaseTTL: time.Second, PollInterval: time.Second, OnStoreFailure: 7, ID: "pod 1"})
	for _, field := range []string{"PollInterval", "OnStoreFailure", "ID"} {
		if !strings.Contains(err.Error(), "SemaphoreConfig."+field+" is") {
			t.Errorf("error %q does not name SemaphoreConfig.%s", err, field)
		}
	}
	s, err := fleet.NewSemaphore(fleet.SemaphoreConfig{Store: new(fleet.MemorySemaphoreStore), Name: "x"})
	if err != nil || s.Limit() != fleet.DefaultSemaphoreLimit {
		t.Fatalf("zero fields: %v, limit %d; want the defaults", err, s.Limit())
	}
}

func TestSemaphoreErrorsAreBulkheadFull(t *testing.T) {
	for _, err := range []error{fleet.ErrFull, fleet.ErrStoreUnavailable} {
		if !errors.Is(err, bulkhead.ErrFull) || !errors.Is(err, fleet.ErrFull) {
			t.Errorf("%v does not match bulkhead.ErrFull and fleet.ErrFull", err)
		}
	}
}

func TestSemaphoreLimitAndFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := new(fleet.MemorySemaphoreStore)
		// Two processes sharing one semaphore of 2 slots.
		a := mustSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 2, MaxWait: -1})
		b := mustSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 2, MaxWait: -1})
		r1, r2 := mustTake(t, a), mustTake(t, b)
		if n := store.InUse("api"); n != 2 {
			t.Fatalf("in use %d; want 2", n)
		}
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		releases := make(chan func(), 4)
		for i := range 4 {
			s := []*fleet.Semaphore{a, b}[i%2]
			wg.Go(func() {
				release, err := s.Acquire(context.Background())
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				releases <- release
			})
			synctest.Wait() // queued in this order
		}
		if a.Waiting()+b.Waiting() != 4 {
			t.Fatalf("waiting %d+%d; want 4", a.Waiting(), b.Waiting())
		}
		served := func(want ...int) {
			t.Helper()
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			if !slicesEqual(order, want) {
				t.Fatalf("served %v; want %v, in arrival order", order, want)
			}
		}
		r1()
		r1() // a second call frees nothing more
		served(0)
		if n := store.InUse("api"); n != 2 {
			t.Fatalf("in use %d after one release; want 2: the slot handed on", n)
		}
		r2()
		served(0, 1)
		(<-releases)()
		served(0, 1, 2)
		(<-releases)()
		served(0, 1, 2, 3)
		(<-releases)()
		(<-releases)()
		wg.Wait()
		if n := store.InUse("api"); n != 0 {
			t.Fatalf("in use %d at the end; want 0", n)
		}
	})
}

func slicesEqual(a, b []int) bool {
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

func TestSemaphoreWaitBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := new(fleet.MemorySemaphoreStore)
		var rejects atomic.Int32
		obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			if e.Kind == event.BulkheadReject && e.Dependency == "api" {
				rejects.Add(1)
			}
			return ctx
		})
		s := mustSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 1, Observer: obs})
		release := mustTake(t, s)
		defer release()
		start := time.Now()
		if _, err := s.Acquire(context.Background()); err != fleet.ErrFull || time.Since(start) != fleet.DefaultSemaphoreWait {
			t.Fatalf("Acquire = %v after %v; want ErrFull after MaxWait", err, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start = time.Now()
		if _, err := s.Acquire(ctx); err != context.DeadlineExceeded || time.Since(start) != 300*time.Millisecond {
			t.Fatalf("Acquire = %v after %v; want the deadline after 300ms", err, time.Since(start))
		}
		if s.Waiting() != 0 || rejects.Load() != 1 {
			t.Fatalf("waiting %d, %d rejects; want 0 and 1", s.Waiting(), rejects.Load())
		}
	})
}

func TestSemaphoreCrashedHolderComesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := new(fleet.MemorySemaphoreStore)
		const ttl = time.Second
		// A process took the only slot and died: nobody renews its lease.
		if st, err := store.Acquire(context.Background(), "api", 1, "dead", ttl); err != nil || !st.Held {
			t.Fatal(st, err)
		}
		s := mustSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 1, LeaseTTL: ttl, MaxWait: -1})
		start := time.Now()
		release := mustTake(t, s)
		// Reclaimed by the waiter's first poll after the lease ended.
		if d := time.Since(start); d < ttl || d > ttl+ttl/3 {
			t.Fatalf("slot came back after %v; want within (%v, %v]", d, ttl, ttl+ttl/3)
		}
		// Held for many leases: the renewals keep it.
		time.Sleep(10 * ttl)
		if st, _ := store.Acquire(context.Background(), "api", 1, "other", ttl); st.Held {
			t.Fatal("a renewed slot was handed to another holder")
		}
		_ = store.Release(context.Background(), "api", 1, "other", ttl)
		release()
		if n := store.InUse("api"); n != 0 {
			t.Fatalf("in use %d; want 0", n)
		}
	})
}

// failStore fails every call, after blocking until ctx ends when block is
// set.
type failStore struct{ block bool }

var errDown = errors.New("store down")

func (f failStore) err(ctx context.Context) error {
	if f.block {
		<-ctx.Done()
		return ctx.Err()
	}
	return errDown
}

func (f failStore) Acquire(ctx context.Context, _ string, _ int, _ string, _ time.Duration) (fleet.SemaphoreState, error) {
	return fleet.SemaphoreState{}, f.err(ctx)
}

func (f failStore) Renew(ctx context.Context, _ string, _ int, _ []string, _ time.Duration) ([]string, error) {
	return nil, f.err(ctx)
}

func (f failStore) Release(ctx context.Context, _ string, _ int, _ string, _ time.Duration) error {
	return f.err(ctx)
}

func TestSemaphoreFailClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mustSem(t, fleet.SemaphoreConfig{Store: failStore{block: true}, Name: "api", OnStoreFailure: fleet.FailClosed})
		start := time.Now()
		_, err := s.Acquire(context.Background())
		if !errors.Is(err, fleet.ErrStoreUnavailable) || !errors.Is(err, bulkhead.ErrFull) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire = %v; want ErrStoreUnavailable wrapping the store's error", err)
		}
		if d := time.Since(start); d != fleet.DefaultSemaphoreStoreTimeout {
			t.Fatalf("refused after %v; want StoreTimeout, %v", d, fleet.DefaultSemaphoreStoreTimeout)
		}
	})
}

func TestSemaphoreFailOpenTakesItsShare(t *testing.T) {
	s := mustSem(t, fleet.SemaphoreConfig{Store: failStore{}, Name: "api", Limit: 5, OnStoreFailure: fleet.FailOpen, Members: fleet.Fixed(2)})
	r1, r2 := mustTake(t, s), mustTake(t, s)
	if _, err := s.Acquire(context.Background()); err != fleet.ErrFull {
		t.Fatalf("third Acquire = %v; want ErrFull: the share is 5/2 = 2", err)
	}
	r1()
	r1()
	r3 := mustTake(t, s)
	r2()
	r3()
	if s.Held() != 0 {
		t.Fatalf("held %d; want 0", s.Held())
	}
}

func TestSemaphoreBacksPolicyBulkhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := new(fleet.MemorySemaphoreStore)
		var inFlight, peak atomic.Int32
		var wg sync.WaitGroup
		for range 3 { // three processes, each with its own Policy
			sem := mustSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 4, MaxWait: -1})
			bh, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 10, MaxWait: -1, Shared: sem})
			if err != nil {
				t.Fatal(err)
			}
			p := guardrail.Policy{Name: "api", Bulkhead: bh}
			for range 10 {
				wg.Go(func() {
					_, err := guardrail.Do(context.Background(), &p, func(context.Context) (int, error) {
						n := inFlight.Add(1)
						for old := peak.Load(); n > old && !peak.CompareAndSwap(old, n); old = peak.Load() {
						}
						time.Sleep(10 * time.Millisecond)
						inFlight.Add(-1)
						return 0, nil
					})
					if err != nil {
						t.Error(err)
					}
				})
			}
		}
		wg.Wait()
		if peak.Load() != 4 {
			t.Fatalf("peak in flight %d; want the fleet's limit, 4", peak.Load())
		}
	})
}

func TestSemaphoreFullIsPolicyBulkheadFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := new(fleet.MemorySemaphoreStore)
		sem := mustSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 1, MaxWait: 100 * time.Millisecond})
		release := mustTake(t, sem)
		defer release()
		bh, _ := bulkhead.New(bulkhead.Config{Shared: sem})
		_, err := guardrail.Do(context.Background(), &guardrail.Policy{Bulkhead: bh}, func(context.Context) (int, error) { return 0, nil })
		if !errors.Is(err, guardrail.ErrBulkheadFull) || !errors.Is(err, fleet.ErrFull) {
			t.Fatalf("Do = %v; want ErrBulkheadFull wrapping fleet.ErrFull", err)
		}
		// The bulkhead's own MaxWait, when sooner, ends the wait first.
		bh, _ = bulkhead.New(bulkhead.Config{MaxWait: 10 * time.Millisecond, Shared: sem})
		start := time.Now()
		_, err = guardrail.Do(context.Background(), &guardrail.Policy{Bulkhead: bh}, func(context.Context) (int, error) { return 0, nil })
		if !errors.Is(err, guardrail.ErrBulkheadFull) || time.Since(start) != 10*time.Millisecond {
			t.Fatalf("Do = %v after %v; want ErrBulkheadFull after 10ms", err, time.Since(start))
		}
	})
}

func TestSemaphoreDeadWaiterSlotComesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := new(fleet.MemorySemaphoreStore)
		const ttl = 3 * time.Second
		ctx := context.Background()
		s := mustSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 1, LeaseTTL: ttl, MaxWait: -1})
		release := mustTake(t, s)
		// A process queued and died: its place lasts ttl/2 from its last
		// ask, and a slot handed to it lasts ttl/3 unless it takes it.
		if st, _ := store.Acquire(ctx, "api", 1, "dead", ttl); st.Held || st.Position != 0 {
			t.Fatalf("dead waiter: %+v; want queued first", st)
		}
		got := make(chan time.Duration)
		go func() {
			start := time.Now()
			r, err := s.Acquire(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- time.Since(start)
			r()
		}()
		synctest.Wait()
		release() // handed to the dead waiter, which never takes it
		if d := <-got; d > ttl/3+ttl/4 {
			t.Fatalf("the slot came back after %v; want within the claim, %v, and a poll, %v", d, ttl/3, ttl/4)
		}
	})
}

// flakyStore fails Renew while down is set.
type flakyStore struct {
	*fleet.MemorySemaphoreStore
	down atomic.Bool
}

func (f *flakyStore) Renew(ctx context.Context, name string, limit int, holders []string, ttl time.Duration) ([]string, error) {
	if f.down.Load() {
		return nil, errDown
	}
	return f.MemorySemaphoreStore.Renew(ctx, name, limit, holders, ttl)
}

func TestSemaphoreLeaseLapsesWithoutRenewals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &flakyStore{MemorySemaphoreStore: new(fleet.MemorySemaphoreStore)}
		const ttl = 3 * time.Second
		s := mustSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", Limit: 1, LeaseTTL: ttl})
		release := mustTake(t, s)
		store.down.Store(true)
		time.Sleep(ttl + time.Millisecond)
		if n := store.InUse("api"); n != 0 {
			t.Fatalf("in use %d after a lease without renewals; want 0", n)
		}
		store.down.Store(false)
		time.Sleep(ttl / 3) // the next renewal learns the slot is lost
		if s.Held() != 0 {
			t.Fatalf("held %d after the store reported the lease lost; want 0", s.Held())
		}
		release()
	})
}

// countingFailStore fails every call and counts them.
type countingFailStore struct {
	failStore
	calls atomic.Int32
}

func (c *countingFailStore) Acquire(ctx context.Context, name string, limit int, holder string, ttl time.Duration) (fleet.SemaphoreState, error) {
	c.calls.Add(1)
	return c.failStore.Acquire(ctx, name, limit, holder, ttl)
}

func TestSemaphoreLeavesAFailedStoreAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := new(countingFailStore)
		s := mustSem(t, fleet.SemaphoreConfig{Store: store, Name: "api", OnStoreFailure: fleet.FailClosed})
		for range 5 {
			if _, err := s.Acquire(context.Background()); !errors.Is(err, fleet.ErrStoreUnavailable) {
				t.Fatalf("Acquire = %v; want ErrStoreUnavailable", err)
			}
		}
		if n := store.calls.Load(); n != 1 {
			t.Fatalf("%d store calls for 5 Acquires within StoreTimeout; want 1", n)
		}
		time.Sleep(fleet.DefaultSemaphoreStoreTimeout)
		s.Acquire(context.Background())
		if n := store.calls.Load(); n != 2 {
			t.Fatalf("%d store calls after StoreTimeout; want 2: the store is tried again", n)
		}
	})
}
