package shed

import (
	"testing"
	"time"
)

// At start the limit is InitialLimit, with no probe, and the no-load
// latency comes from the first requests admitted at low concurrency.
func TestControllerStartsWithoutProbe(t *testing.T) {
	t0 := time.Unix(0, 0)
	g := newController(Adaptive{}, 1, t0)
	if g.probing || g.effective() != 20 {
		t.Fatalf("at start: probing %v at %v, want no probe and the initial 20", g.probing, g.effective())
	}
	rtt := 50 * time.Millisecond
	// Three requests admitted at 1..3 in flight, the rest queued behind them.
	for i := 1; i <= 20; i++ {
		d := rtt
		if i > 10 {
			d = 2 * rtt
		}
		g.observe(t0.Add(d), d, g.gen, i, 20-i)
	}
	g.observe(t0.Add(time.Second), 2*rtt, g.gen, 20, 10) // ends the window
	if g.minRTT != rtt {
		t.Errorf("no-load latency %v, want %v from the first three requests", g.minRTT, rtt)
	}
}

// At a high rate only about 2×sampleCap requests per window are timed,
// so admission and release mostly read no clock.
func TestControllerTimesOneInStride(t *testing.T) {
	t0 := time.Unix(0, 0)
	g := newController(Adaptive{}, 1, t0)
	g.minRTT = time.Millisecond
	g.scheduleProbe(t0)
	const perWindow = 20 * sampleCap
	for i := range perWindow {
		now := t0.Add(time.Duration(i) * g.span() / perWindow)
		if g.sampleNext() {
			g.observe(now, time.Millisecond, g.gen, 10, 10)
		}
	}
	g.observe(t0.Add(g.span()+time.Millisecond), time.Millisecond, g.gen, 10, 10) // ends the window
	if g.stride != perWindow/(2*sampleCap) {
		t.Fatalf("stride = %d after %d requests in a window, want %d", g.stride, perWindow, perWindow/(2*sampleCap))
	}
	timed := 0
	for range perWindow {
		if g.sampleNext() {
			timed++
		}
	}
	if timed != 2*sampleCap {
		t.Fatalf("%d of %d requests timed, want %d", timed, perWindow, 2*sampleCap)
	}
}

// While requests queue and the limit refuses some, the limit lands on the
// completion rate times the no-load latency, plus Buffer and one, in one
// window. The same window with nothing refused leaves the limit alone: the
// limit is not what holds the load back.
func TestControllerCutsToCapacityInOneWindow(t *testing.T) {
	for _, refused := range []bool{true, false} {
		t0 := time.Unix(0, 0)
		g := newController(Adaptive{}, 1, t0)
		g.minRTT = 50 * time.Millisecond
		g.limit = 30
		g.resetWindow(t0, 30)
		g.admitted(30)
		if refused {
			g.refused()
		}
		// A backend of 5 slots: 100 completions a second, each 300 ms long.
		for i := 1; i <= 5; i++ {
			g.completed()
			g.observe(t0.Add(time.Duration(i)*10*time.Millisecond), 300*time.Millisecond, g.gen, 30, 29)
		}
		want := 30.0
		if refused {
			want = 5*1.1 + 1
		}
		if g.limit < want-0.01 || g.limit > want+0.01 {
			t.Errorf("refused %v: limit %.2f after a queued window, want %.2f", refused, g.limit, want)
		}
	}
}

// A minimum learnt from fast requests (the fast failures of a dead
// dependency) is measured again from the requests admitted at low load
// while the server uses less than half its limit, and the periodic probe,
// which halves the limit, is not run while the limit is mostly unused.
func TestControllerRelearnsNoLoadLatencyWhenCalm(t *testing.T) {
	t0 := time.Unix(0, 0)
	g := newController(Adaptive{}, 1, t0)
	g.minRTT = 60 * time.Microsecond
	g.scheduleProbe(t0)
	now := t0
	for range 2 * g.probeSamples {
		now = now.Add(2 * time.Second) // past the probe's schedule, and every window
		g.admitted(2)
		g.completed()
		g.observe(now, 5*time.Millisecond, g.gen, 2, 0)
	}
	if g.minRTT != 5*time.Millisecond {
		t.Errorf("no-load latency %v after calm 5 ms requests, want 5ms", g.minRTT)
	}
	if g.probing || g.effective() != 20 {
		t.Errorf("probing %v at %v while calm, want no probe and the initial 20", g.probing, g.effective())
	}
}

// At the floor, with a no-load latency too low (2.2 ms, learnt from a mix
// with fast failures, for requests of 5 ms), the completion rate times it
// puts the limit at the floor again, a cut of nothing: the queue that does
// not drain there counts towards a probe all the same, which measures the
// no-load latency again.
func TestControllerProbesWhenHeldAtTheFloor(t *testing.T) {
	t0 := time.Unix(0, 0)
	g := newController(Adaptive{}, defaultShares[Normal], t0)
	g.minRTT = 2200 * time.Microsecond
	g.limit = g.min
	g.scheduleProbe(t0)
	g.resetWindow(t0, 3)
	now := t0
	// Three in flight, 5 ms each: 600 a second. The target is
	// (600 × 2.2 ms × 1.1 + 1) / 0.85 = 2.88, above 0.9 × 3: not a cut.
	for i := 0; i < 20*30 && !g.probing; i++ {
		now = now.Add(5 * time.Millisecond / 3)
		g.admitted(3)
		g.refused()
		g.completed()
		g.observe(now, 5*time.Millisecond, g.gen, 3, 2)
	}
	if !g.probing {
		t.Fatalf("not probing after 20 windows held at the floor with every request queued")
	}
	if d := now.Sub(t0); d > time.Second {
		t.Errorf("probe after %v, want within a second", d)
	}
}

// A window in use in which nine in ten requests are faster than the
// no-load latency by a tenth shows it was measured slow, and lowers it; a
// window whose mean is faster only because half its requests are fast
// failures does not.
func TestControllerLowersNoLoadLatencyOnlyWhenMostAreFaster(t *testing.T) {
	for _, c := range []struct {
		name string
		rtt  func(i int) time.Duration
		want time.Duration
	}{
		{"all faster", func(int) time.Duration { return 40 * time.Millisecond }, 40 * time.Millisecond},
		{"half fast failures", func(i int) time.Duration {
			if i%2 == 0 {
				return 60 * time.Microsecond
			}
			return 50 * time.Millisecond
		}, 50 * time.Millisecond},
	} {
		t0 := time.Unix(0, 0)
		g := newController(Adaptive{}, 1, t0)
		g.minRTT = 50 * time.Millisecond
		g.limit = 20
		g.scheduleProbe(t0)
		g.resetWindow(t0, 15)
		g.admitted(15)
		for i := 1; i <= 40; i++ {
			g.completed()
			g.observe(t0.Add(time.Duration(i)*2*time.Millisecond), c.rtt(i), g.gen, 15, 14)
		}
		if g.minRTT != c.want {
			t.Errorf("%s: no-load latency %v after a window in use, want %v", c.name, g.minRTT, c.want)
		}
	}
}
