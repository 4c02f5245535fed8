package breaker_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
)

var sinkErr error

func allowDone(b *breaker.Breaker, d time.Duration) {
	p, err := b.Allow()
	if err != nil {
		sinkErr = err
		return
	}
	p.Done(breaker.Success, d)
}

func TestHotPathsDoNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage counters change allocation counts")
	}
	closed := mustNew(breaker.Config{})
	slow := mustNew(breaker.Config{SlowCall: time.Second})
	count := mustNew(breaker.Config{CountWindow: 100})
	open := mustNew(breaker.Config{MinRequests: 1})
	calls(open, breaker.Failure, 1)
	forced := mustNew(breaker.Config{})
	forced.ForceOpen()
	half := mustNew(breaker.Config{MinRequests: 1, OpenFor: time.Nanosecond})
	calls(half, breaker.Failure, 1)
	time.Sleep(time.Microsecond)
	hold, _ := half.Allow() // takes the only probe slot
	defer hold.Done(breaker.Ignored, 0)
	g := mustGroup(breaker.GroupConfig{})
	g.Get("api.example.com")

	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"closed success", func() { allowDone(closed, 0) }},
		{"closed failure", func() {
			p, _ := closed.Allow()
			p.Done(breaker.Failure, 0)
		}},
		{"closed slow tracking", func() { allowDone(slow, 2*time.Second) }},
		{"count window", func() { allowDone(count, 0) }},
		{"open rejection", func() { allowDone(open, 0) }},
		{"forced open rejection", func() { allowDone(forced, 0) }},
		{"half-open rejection", func() { allowDone(half, 0) }},
		{"execute", func() { sinkErr = closed.Execute(func() error { return nil }) }},
		{"group get", func() { g.Get("api.example.com") }},
	} {
		if n := testing.AllocsPerRun(1000, tc.fn); n != 0 {
			t.Errorf("%s: %v allocs per call, want 0", tc.name, n)
		}
	}
}

func BenchmarkTimeNow(b *testing.B) {
	var t time.Time
	for b.Loop() {
		t = time.Now()
	}
	_ = t
}

func BenchmarkClosedSuccess(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  breaker.Config
		d    time.Duration
	}{
		{"time", breaker.Config{}, 0},
		{"time_slow", breaker.Config{SlowCall: time.Second}, time.Millisecond},
		{"count", breaker.Config{CountWindow: 100}, 0},
	} {
		b.Run(tc.name, func(b *testing.B) {
			br := mustNew(tc.cfg)
			b.ReportAllocs()
			for b.Loop() {
				allowDone(br, tc.d)
			}
		})
		b.Run(tc.name+"_parallel", func(b *testing.B) {
			br := mustNew(tc.cfg)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					allowDone(br, tc.d)
				}
			})
		})
	}
}

func BenchmarkExecute(b *testing.B) {
	br := mustNew(breaker.Config{})
	fn := func() error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		sinkErr = br.Execute(fn)
	}
}

func BenchmarkOpenReject(b *testing.B) {
	newOpen := func() *breaker.Breaker {
		br := mustNew(breaker.Config{MinRequests: 1, OpenFor: time.Hour})
		calls(br, breaker.Failure, 1)
		return br
	}
	b.Run("seq", func(b *testing.B) {
		br := newOpen()
		b.ReportAllocs()
		for b.Loop() {
			allowDone(br, 0)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		br := newOpen()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				allowDone(br, 0)
			}
		})
	})
}

func BenchmarkGroupGet(b *testing.B) {
	g := mustGroup(breaker.GroupConfig{})
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = "host-" + strconv.Itoa(i)
		g.Get(keys[i])
	}
	b.Run("seq", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			g.Get(keys[i%len(keys)])
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				g.Get(keys[i%len(keys)])
				i++
			}
		})
	})
}

// BenchmarkSharedClock measures what the breaker adds to a caller that reads
// the clock at the start and end of each attempt anyway (as guardrail.Do
// does): clock_only is those two reads, breaker adds AllowAt and DoneAt
// with slow-call tracking on, reusing them.
func BenchmarkSharedClock(b *testing.B) {
	b.Run("impl=clock_only", func(b *testing.B) {
		var d time.Duration
		for b.Loop() {
			start := time.Now()
			end := time.Now()
			d += end.Sub(start)
		}
		_ = d
	})
	b.Run("impl=breaker", func(b *testing.B) {
		br := mustNew(breaker.Config{SlowCall: time.Second})
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			p, err := br.AllowAt(start)
			if err != nil {
				b.Fatal(err)
			}
			end := time.Now()
			p.DoneAt(breaker.Success, end.Sub(start), end)
		}
	})
}
