package bench

import (
	"runtime"
	"runtime/metrics"
	"syscall"
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

// cpuTime is the CPU time this process has used, user and system, on all
// threads: the benchmark's goroutines, the garbage collector it causes and,
// in the HTTP rows, the loopback server.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// counter measures the goroutines a benchmark creates and the CPU time it
// uses per operation. Start it after the setup, just before the timed loop,
// and report after it.
//
// cpu-ns/op complements ns/op on a shared machine: wall time also counts
// the moments another process held the core, CPU time does not. Under
// RunParallel it adds up the CPU time of every core, so it is about
// GOMAXPROCS times ns/op when the cores are kept busy.
type counter struct {
	goroutines uint64
	cpu        time.Duration
}

func startCounting() counter { return counter{createdSoFar(), cpuTime()} }

// report adds goroutines/op and cpu-ns/op to b's results. harness is the
// number of goroutines the testing package itself started in between
// (RunParallel starts one per GOMAXPROCS); they are not the library's.
func (c counter) report(b *testing.B, harness uint64) {
	if b.N == 0 {
		return
	}
	cpu := cpuTime() - c.cpu
	n := createdSoFar() - c.goroutines
	n -= min(n, harness)
	b.ReportMetric(float64(n)/float64(b.N), "goroutines/op")
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
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
