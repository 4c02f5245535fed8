package bench

import (
	"context"
	"testing"
	"time"

	fsbulkhead "github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/guardrail-go/guardrail/bulkhead"
	"golang.org/x/sync/semaphore"
)

// BenchmarkBulkhead takes a slot and gives it back, with a slot free: the
// cost a bulkhead adds to every call that it lets through. Each bulkhead
// holds 64 slots, so neither run ever waits, and waiting is allowed (a
// queue, a maximum wait of 1 s) where the library has it.
func BenchmarkBulkhead(b *testing.B) {
	const slots = 64
	const maxWait = time.Second
	ctx := context.Background()
	b.Run("impl=guardrail-acquire", func(b *testing.B) {
		bh := must(bulkhead.New(bulkhead.Config{MaxConcurrent: slots, MaxQueue: slots, MaxWait: maxWait}))
		modes(b, func() {
			slot, err := bh.Acquire(ctx)
			if err != nil {
				sinkErr = err
				return
			}
			slot.Release()
		})
	})
	b.Run("impl=failsafe-acquire-maxwait", func(b *testing.B) {
		bh := fsbulkhead.NewBuilder[int](slots).WithMaxWaitTime(maxWait).Build()
		modes(b, func() {
			if err := bh.AcquirePermitWithMaxWait(ctx, maxWait); err != nil {
				sinkErr = err
				return
			}
			bh.ReleasePermit()
		})
	})
	b.Run("impl=failsafe-try-acquire", func(b *testing.B) {
		bh := fsbulkhead.New[int](slots)
		modes(b, func() {
			if !bh.TryAcquirePermit() {
				sinkBool = false
				return
			}
			bh.ReleasePermit()
		})
	})
	b.Run("impl=semaphore-acquire", func(b *testing.B) {
		// golang.org/x/sync/semaphore: the baseline, a weighted semaphore
		// with no queue limit and no maximum wait but the context's.
		sem := semaphore.NewWeighted(slots)
		modes(b, func() {
			if err := sem.Acquire(ctx, 1); err != nil {
				sinkErr = err
				return
			}
			sem.Release(1)
		})
	})
	b.Run("impl=semaphore-try-acquire", func(b *testing.B) {
		sem := semaphore.NewWeighted(slots)
		modes(b, func() {
			if !sem.TryAcquire(1) {
				sinkBool = false
				return
			}
			sem.Release(1)
		})
	})
}
