package sim

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
)

// holders starts n goroutines that each take a slot, record their id in
// order of grant, and hold it until their release channel is closed. Each
// is started only once the previous one is blocked, so they queue in id
// order.
type holders struct {
	mu      sync.Mutex
	granted []int
	release []chan struct{}
	errs    []error
	wg      sync.WaitGroup
}

func (h *holders) start(t *testing.T, p *Pool, ctx context.Context, id int) {
	t.Helper()
	for len(h.release) <= id {
		h.release = append(h.release, make(chan struct{}))
		h.errs = append(h.errs, nil)
	}
	rel := h.release[id]
	h.wg.Go(func() {
		if err := p.Acquire(ctx); err != nil {
			h.mu.Lock()
			h.errs[id] = err
			h.mu.Unlock()
			return
		}
		h.mu.Lock()
		h.granted = append(h.granted, id)
		h.mu.Unlock()
		<-rel
		p.Release()
	})
	synctest.Wait()
}

func (h *holders) got() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.granted)
}

func (h *holders) done(id int) {
	close(h.release[id])
	synctest.Wait()
}

func TestPoolFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPool(2)
		var h holders
		for id := range 7 {
			h.start(t, p, t.Context(), id)
		}
		if got := h.got(); !slices.Equal(got, []int{0, 1}) {
			t.Fatalf("granted %v, want the first two", got)
		}
		// Release out of order: the line still moves in arrival order.
		for i, id := range []int{1, 0, 3, 2, 5} {
			h.done(id)
			want := []int{0, 1, 2, 3, 4, 5, 6}[:3+i]
			if got := h.got(); !slices.Equal(got, want) {
				t.Fatalf("after releasing %d: granted %v, want %v", id, got, want)
			}
		}
		h.done(4)
		h.done(6)
		h.wg.Wait()
		if in, w, _ := p.Stats(); in != 0 || w != 0 {
			t.Fatalf("in use %d, waiting %d at the end, want 0 and 0", in, w)
		}
	})
}

func TestPoolGrowAdmitsOldestAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPool(2)
		var h holders
		for id := range 8 {
			h.start(t, p, t.Context(), id)
		}
		p.Resize(5)
		synctest.Wait()
		// Granted together; the goroutines then record in any order.
		if got := h.got(); !slices.Equal(slices.Sorted(slices.Values(got)), []int{0, 1, 2, 3, 4}) {
			t.Fatalf("after growing to 5: granted %v, want 0..4", got)
		}
		if in, w, size := p.Stats(); in != 5 || w != 3 || size != 5 {
			t.Fatalf("in use %d, waiting %d, size %d; want 5, 3, 5", in, w, size)
		}
		for id := range 8 {
			h.done(id)
		}
		h.wg.Wait()
	})
}

func TestPoolShrinkWaitsForReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPool(4)
		var h holders
		for id := range 4 {
			h.start(t, p, t.Context(), id)
		}
		p.Resize(2)
		h.start(t, p, t.Context(), 4)
		h.start(t, p, t.Context(), 5)
		// In use 4 > 2: the first two releases free nothing for the line.
		h.done(0)
		h.done(1)
		if got := h.got(); len(got) != 4 {
			t.Fatalf("granted %v after two releases over the new size, want no new grant", got)
		}
		if in, w, _ := p.Stats(); in != 2 || w != 2 {
			t.Fatalf("in use %d, waiting %d; want 2 and 2", in, w)
		}
		h.done(2)
		if got := h.got(); !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
			t.Fatalf("granted %v, want the oldest waiter (4) once below the size", got)
		}
		h.done(3)
		h.done(4)
		h.done(5)
		h.wg.Wait()
		if got := h.got(); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5}) {
			t.Fatalf("granted %v, want every waiter in order", got)
		}
	})
}

func TestPoolCancelledWaiterLeavesTheLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPool(1)
		var h holders
		h.start(t, p, t.Context(), 0)
		ctx, cancel := context.WithCancel(t.Context())
		h.start(t, p, ctx, 1)
		h.start(t, p, t.Context(), 2)
		cancel()
		synctest.Wait()
		if h.errs[1] != context.Canceled {
			t.Fatalf("cancelled waiter got %v, want context.Canceled", h.errs[1])
		}
		if _, w, _ := p.Stats(); w != 1 {
			t.Fatalf("waiting %d after a cancel, want 1", w)
		}
		h.done(0)
		if got := h.got(); !slices.Equal(got, []int{0, 2}) {
			t.Fatalf("granted %v, want the slot to skip the cancelled waiter", got)
		}
		h.done(2)
		h.wg.Wait()
	})
}

// A waiter granted a slot just as its context ends must hand the slot on,
// not keep or lose it, whichever way its select goes.
func TestPoolGrantRacingCancelLosesNoSlot(t *testing.T) {
	for range 200 {
		synctest.Test(t, func(t *testing.T) {
			p := NewPool(1)
			var h holders
			h.start(t, p, t.Context(), 0)
			ctx, cancel := context.WithCancel(t.Context())
			h.start(t, p, ctx, 1)
			h.start(t, p, t.Context(), 2)
			// Both before the waiter runs: it is granted and cancelled.
			close(h.release[0])
			cancel()
			synctest.Wait()
			got := h.got()
			switch {
			case slices.Equal(got, []int{0, 1}): // took it, holds it
				if h.errs[1] != nil {
					t.Fatalf("waiter 1 both granted and failed: %v", h.errs[1])
				}
				h.done(1)
			case slices.Equal(got, []int{0, 2}): // handed it on
				if h.errs[1] != context.Canceled {
					t.Fatalf("waiter 1 got %v, want context.Canceled", h.errs[1])
				}
			default:
				t.Fatalf("granted %v, want 0 then 1 or 2", got)
			}
			if got := h.got(); got[len(got)-1] != 2 {
				t.Fatalf("granted %v: waiter 2 lost its turn", got)
			}
			h.done(2)
			h.wg.Wait()
			if in, w, _ := p.Stats(); in != 0 || w != 0 {
				t.Fatalf("in use %d, waiting %d at the end, want 0 and 0", in, w)
			}
		})
	}
}
