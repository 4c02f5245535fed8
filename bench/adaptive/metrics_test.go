package main

import (
	"math"
	"testing"
	"time"
)

// synth builds records whose 200s complete count[b] in 100 ms bucket b,
// each sent and started 10 ms into its bucket and answered 20 ms later.
func synth(counts []int) []record {
	var recs []record
	for b, c := range counts {
		at := time.Duration(b)*bucket + 10*time.Millisecond
		for range c {
			recs = append(recs, record{Sched: at, Start: at, Lat: 20 * time.Millisecond, Status: 200})
		}
	}
	return recs
}

func repeat(v, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func concat(parts ...[]int) []int {
	var s []int
	for _, p := range parts {
		s = append(s, p...)
	}
	return s
}

func TestAnalyzeGoodputAndConvergence(t *testing.T) {
	w := workload{Slots: []int{10, 5, 20}, Phase: time.Second, Hold: 50 * time.Millisecond}
	// Capacity per 100 ms bucket: 20, 10, 40 completions.
	counts := concat(
		concat([]int{5, 12}, repeat(20, 8)),      // phase 1: cold start, in band from bucket 2
		concat([]int{15, 14, 13}, repeat(10, 7)), // phase 2: drains the old in-flight work for 300 ms
		concat(repeat(20, 5), repeat(40, 5)),     // phase 3: 500 ms at the old rate
	)
	recs := synth(counts)
	// Not goodput: a 503, an error, and a 200 past the timeout.
	recs = append(recs,
		record{Sched: 100 * time.Millisecond, Start: 100 * time.Millisecond, Lat: time.Millisecond, Status: 503},
		record{Sched: 100 * time.Millisecond, Start: 100 * time.Millisecond, Lat: time.Second, Status: 0},
		record{Sched: 200 * time.Millisecond, Start: 200 * time.Millisecond, Lat: 2 * time.Second, Status: 200},
	)
	got := analyze(recs, w, time.Second, nil)
	want := []struct {
		sent, ok int
		goodput  float64
		converge time.Duration
		steady   float64
	}{
		{sum(counts[0:10]) + 3, sum(counts[0:10]), float64(sum(counts[0:10])) / 200 * 100, 300 * time.Millisecond, 20},
		{sum(counts[10:20]), sum(counts[10:20]), float64(sum(counts[10:20])) / 100 * 100, 400 * time.Millisecond, 10},
		{sum(counts[20:30]), sum(counts[20:30]), float64(sum(counts[20:30])) / 400 * 100, 600 * time.Millisecond, 40},
	}
	for i, w := range want {
		g := got[i]
		if g.Phase != i+1 || g.Sent != w.sent || g.OK != w.ok || math.Abs(g.GoodputPct-w.goodput) > 1e-9 ||
			g.Converge != w.converge || g.Steady != w.steady {
			t.Errorf("phase %d: got sent %d ok %d goodput %.2f converge %v steady %g; want %d %d %.2f %v %g",
				i+1, g.Sent, g.OK, g.GoodputPct, g.Converge, g.Steady, w.sent, w.ok, w.goodput, w.converge, w.steady)
		}
		if g.P99OK != 20*time.Millisecond {
			t.Errorf("phase %d: p99 %v, want 20ms", i+1, g.P99OK)
		}
		if g.LimitMedian != -1 {
			t.Errorf("phase %d: limit %d without samples, want -1", i+1, g.LimitMedian)
		}
	}
}

func sum(s []int) int {
	n := 0
	for _, v := range s {
		n += v
	}
	return n
}

// A request counts in the phase it was sent in for goodput, and in the
// bucket it completed in for convergence.
func TestAnalyzeAttributesBySendTime(t *testing.T) {
	w := workload{Slots: []int{10, 10}, Phase: time.Second, Hold: 50 * time.Millisecond}
	recs := []record{
		{Sched: 990 * time.Millisecond, Start: 990 * time.Millisecond, Lat: 60 * time.Millisecond, Status: 200},
	}
	got := analyze(recs, w, time.Second, nil)
	if got[0].OK != 1 || got[1].OK != 0 {
		t.Fatalf("OK by phase %d, %d; want 1, 0 (by send time)", got[0].OK, got[1].OK)
	}
	if got[0].GoodputDonePct != 0 || got[1].GoodputDonePct != 100.0/200 {
		t.Fatalf("goodput by completion %g, %g; want 0 and 0.5 %% (1 of 200 per second)", got[0].GoodputDonePct, got[1].GoodputDonePct)
	}
	if got[0].P99OK != 60*time.Millisecond || got[1].P99OK != -1 {
		t.Fatalf("p99 by phase %v, %v; want 60ms and none", got[0].P99OK, got[1].P99OK)
	}
}

func TestConverge(t *testing.T) {
	f := func(v ...float64) []float64 { return v }
	for _, c := range []struct {
		name   string
		bs     []float64
		steady float64
		want   time.Duration
	}{
		{"at once", f(40, 40, 40, 40), 40, 100 * time.Millisecond},
		{"within 5 percent", f(38, 42, 39, 41), 40, 100 * time.Millisecond},
		{"after two buckets", f(20, 30, 40, 39, 41), 40, 300 * time.Millisecond},
		{"one bucket in band is not convergence", f(20, 40, 20, 40, 20, 40, 40, 40), 40, 600 * time.Millisecond},
		{"too high counts too", f(60, 50, 40, 40, 40), 40, 300 * time.Millisecond},
		{"never", f(20, 30, 20, 30), 40, -1},
		{"band at least one request", f(9, 11, 10), 10, 100 * time.Millisecond},
		{"cut short by the phase's end", f(20, 20, 20, 40), 40, 400 * time.Millisecond},
	} {
		if got := converge(c.bs, c.steady); got != c.want {
			t.Errorf("%s: converge = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestLimitStats(t *testing.T) {
	w := workload{Slots: []int{10, 5}, Phase: time.Second, Hold: 50 * time.Millisecond}
	var s []limitSample
	for i, l := range []int{20, 18, 16, 9, 7, 8} {
		s = append(s, limitSample{T: time.Duration(i) * 400 * time.Millisecond, Limit: l})
	}
	// At 0, 400, 800 ms: phase 1; 1200, 1600 ms: phase 2; 2000 ms: past the end.
	if med, lo, hi := limitStats(s, w, 0); med != 18 || lo != 16 || hi != 20 {
		t.Errorf("phase 1: %d [%d-%d], want 18 [16-20]", med, lo, hi)
	}
	if med, lo, hi := limitStats(s, w, 1); med != 9 || lo != 7 || hi != 9 {
		t.Errorf("phase 2: %d [%d-%d], want 9 [7-9]", med, lo, hi)
	}
}

func TestCheckLoad(t *testing.T) {
	const rps = 100
	span := time.Second
	mk := func(lag func(i int) time.Duration, n int) []record {
		recs := make([]record, n)
		for i := range recs {
			s := time.Duration(i) * 10 * time.Millisecond
			recs[i] = record{Sched: s, Start: s + lag(i)}
		}
		return recs
	}
	onTime := func(int) time.Duration { return time.Millisecond }
	if c := checkLoad(mk(onTime, 100), rps, span); !c.Judged || c.Achieved != 100 {
		t.Errorf("on schedule: %+v, want judged at 100/s", c)
	}
	// Every 10th request 80 ms late: p99 lag 80 ms.
	late := func(i int) time.Duration {
		if i%10 == 0 {
			return 80 * time.Millisecond
		}
		return 0
	}
	if c := checkLoad(mk(late, 100), rps, span); c.Judged || c.P99Lag != 80*time.Millisecond {
		t.Errorf("late starts: %+v, want not judged with p99 lag 80ms", c)
	}
	// Falling behind steadily: the last 10 % start after the span.
	drift := func(i int) time.Duration { return time.Duration(i) * time.Millisecond }
	if c := checkLoad(mk(drift, 100), rps, span); c.Judged || c.Achieved >= 95 {
		t.Errorf("drifting: %+v, want not judged below 95/s", c)
	}
}

func TestPercentile(t *testing.T) {
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(100-i) * time.Millisecond
	}
	if got := percentile(ds, 0.99); got != 99*time.Millisecond {
		t.Errorf("p99 of 1..100 ms = %v, want 99ms", got)
	}
	if got := percentile(nil, 0.99); got != -1 {
		t.Errorf("p99 of nothing = %v, want -1", got)
	}
}
