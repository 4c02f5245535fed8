package guardhttp

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// fakeItem is a watched phase due at a given time.
type fakeItem struct {
	idx   int
	due   atomic.Int64 // 0: not timed
	ended atomic.Int64 // when check ended it
}

func (f *fakeItem) slot() *int { return &f.idx }

func (f *fakeItem) check(now int64, _ func() int64) bool {
	due := f.due.Load()
	if due == 0 {
		return false
	}
	if now < due {
		return true
	}
	f.due.Store(0)
	f.ended.Store(now)
	return false
}

// The watchdog ends a phase no earlier than its due time and at most one
// tick later, and stops ticking once nothing is timed.
func TestWatchdogTicksOnlyWhileSomethingIsTimed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		clock := func() int64 { return int64(time.Since(start)) + 1 }
		const limit = 160 * time.Millisecond
		w := newWatchdog(limit)
		w.clock = clock
		if w.tick != limit/16 {
			t.Fatalf("tick %v, want %v", w.tick, limit/16)
		}
		a, b := &fakeItem{}, &fakeItem{}
		w.add(a)
		w.add(b)
		synctest.Wait()
		if w.running.Load() {
			t.Fatal("running with nothing timed")
		}
		a.due.Store(clock() + int64(limit))
		w.wake()
		time.Sleep(limit / 2)
		b.due.Store(clock() + int64(limit)) // while running: no wake needed
		time.Sleep(2 * limit)
		synctest.Wait()
		for name, it := range map[string]*fakeItem{"a": a, "b": b} {
			if it.ended.Load() == 0 {
				t.Fatalf("%s never ended", name)
			}
		}
		if late := time.Duration(a.ended.Load() - (int64(limit) + 1)); late < 0 || late > w.tick {
			t.Errorf("a ended %v after its due time, want within one tick (%v)", late, w.tick)
		}
		if w.running.Load() {
			t.Error("still ticking with nothing timed")
		}
		w.remove(a)
		w.remove(a) // twice: no effect
		if len(w.items) != 1 || w.items[0] != watched(b) || b.idx != 0 {
			t.Errorf("items after removing a: %v (b at %d)", w.items, b.idx)
		}
		// It starts again when woken.
		b.due.Store(clock() + int64(limit))
		w.wake()
		time.Sleep(limit + w.tick)
		synctest.Wait()
		if b.due.Load() != 0 {
			t.Error("not ended after the watchdog was woken again")
		}
	})
}

// Ticks are a sixteenth of the shortest limit, within bounds.
func TestWatchdogTick(t *testing.T) {
	for _, tt := range []struct {
		shortest time.Duration
		want     time.Duration
	}{
		{0, maxTick},
		{time.Hour, maxTick},
		{800 * time.Millisecond, 50 * time.Millisecond},
		{time.Millisecond, minTick},
	} {
		if got := newWatchdog(tt.shortest).tick; got != tt.want {
			t.Errorf("tick for %v = %v, want %v", tt.shortest, got, tt.want)
		}
	}
	s := settings{write: 3 * time.Second, header: -1, bodyIdle: 2 * time.Second}
	if got := s.shortestLimit(); got != 2*time.Second {
		t.Errorf("shortest limit %v, want 2s", got)
	}
}
