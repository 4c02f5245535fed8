package bulkhead_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/bulkhead"
)

// countShared is a Shared of n slots that waits on ctx when they are
// taken, as a fleet semaphore does.
type countShared struct {
	mu    sync.Mutex
	n     int
	taken int
	freed chan struct{}
}

func newCountShared(n int) *countShared { return &countShared{n: n, freed: make(chan struct{}, 100)} }

func (c *countShared) Acquire(ctx context.Context) (func(), error) {
	for {
		c.mu.Lock()
		if c.taken < c.n {
			c.taken++
			c.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					c.mu.Lock()
					c.taken--
					c.mu.Unlock()
					c.freed <- struct{}{}
				})
			}, nil
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.freed:
		}
	}
}

func (c *countShared) inUse() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.taken
}

func TestSharedBoundsBothCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sh := newCountShared(1)
		b := mustNew(bulkhead.Config{MaxConcurrent: 2, Shared: sh})
		s1 := mustAcquire(t, b)
		if sh.inUse() != 1 || b.InFlight() != 1 {
			t.Fatalf("shared %d, local %d; want 1 and 1", sh.inUse(), b.InFlight())
		}
		// The shared slot is taken: the wait for it ends with MaxWait, and
		// the local slot taken meanwhile is given back.
		start := time.Now()
		_, err := b.Acquire(context.Background())
		if !errors.Is(err, bulkhead.ErrFull) || time.Since(start) != bulkhead.DefaultMaxWait {
			t.Fatalf("Acquire = %v after %v; want ErrFull after MaxWait", err, time.Since(start))
		}
		if b.InFlight() != 1 {
			t.Fatalf("in flight %d after a refused shared slot; want 1", b.InFlight())
		}
		s1.Release()
		s1.Release() // a second Release frees nothing more
		if sh.inUse() != 0 || b.InFlight() != 0 {
			t.Fatalf("shared %d, local %d after Release; want 0 and 0", sh.inUse(), b.InFlight())
		}
	})
}

func TestSharedWaitEndsAtLatest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sh := newCountShared(1)
		b := mustNew(bulkhead.Config{MaxConcurrent: 5, MaxWait: time.Hour, Shared: sh})
		s1 := mustAcquire(t, b)
		defer s1.Release()
		start := time.Now()
		_, err := b.AcquireBy(context.Background(), start.Add(time.Second))
		if err != bulkhead.ErrNoTime || time.Since(start) != time.Second {
			t.Fatalf("AcquireBy = %v after %v; want ErrNoTime after 1s", err, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start = time.Now()
		if _, err := b.Acquire(ctx); err != context.DeadlineExceeded || time.Since(start) != time.Minute {
			t.Fatalf("Acquire = %v after %v; want the context's deadline after 1m", err, time.Since(start))
		}
	})
}

func TestSharedSlotHandedOnRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sh := newCountShared(1)
		b := mustNew(bulkhead.Config{MaxConcurrent: 5, Shared: sh})
		s1 := mustAcquire(t, b)
		got := make(chan error)
		go func() {
			s, err := b.Acquire(context.Background())
			s.Release()
			got <- err
		}()
		synctest.Wait()
		s1.Release()
		if err := <-got; err != nil {
			t.Fatalf("waiter: %v; want the freed shared slot", err)
		}
	})
}
