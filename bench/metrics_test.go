package bench

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

// Sinks keep results alive so the compiler cannot drop the calls.
var (
	sinkInt  int
	sinkErr  error
	sinkBool bool
	sinkTime time.Time
)

// goroutinesCreated is the process's count of goroutines created since it
// started: a counter that only grows, so a goroutine that starts and ends
// inside the loop is counted even though runtime.NumGoroutine would never
// see it.
const goroutinesCreated = "/sched/goroutines-created:goroutines"

func createdSoFar() uint64 {
	s := [1]metrics.Sample{{Name: goroutinesCreated}}
	metrics.Read(s[:])
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// counter measures the goroutines a benchmark creates per operation. Start
// it after the setup, just before the timed loop, and report after it.
type counter struct{ start uint64 }

func startCounting() counter { return counter{createdSoFar()} }

// report adds goroutines/op to b's results. harness is the number of
// goroutines the testing package itself started in between (RunParallel
// starts one per GOMAXPROCS); they are not the library's.
func (c counter) report(b *testing.B, harness uint64) {
	if b.N == 0 {
		return
	}
	n := createdSoFar() - c.start
	n -= min(n, harness)
	b.ReportMetric(float64(n)/float64(b.N), "goroutines/op")
}

// loop runs op b.N times (through b.Loop) with allocation and goroutine
// reporting.
func loop(b *testing.B, op func()) {
	b.ReportAllocs()
	c := startCounting()
	for b.Loop() {
		op()
	}
	c.report(b, 0)
}

// parallel runs op under b.RunParallel with allocation and goroutine
// reporting.
func parallel(b *testing.B, op func()) {
	b.ReportAllocs()
	c := startCounting()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			op()
		}
	})
	c.report(b, uint64(runtime.GOMAXPROCS(0)))
}

// modes runs op sequentially and in parallel as sub-benchmarks run=seq and
// run=par.
func modes(b *testing.B, op func()) {
	b.Run("run=seq", func(b *testing.B) { loop(b, op) })
	b.Run("run=par", func(b *testing.B) { parallel(b, op) })
}
