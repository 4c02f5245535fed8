package shed

import (
	"testing"
	"time"
)

// The first min-RTT probe, at the floor, measures a fifth of the samples;
// later probes, at half the limit, measure them all.
func TestFirstProbeIsShort(t *testing.T) {
	now := time.Unix(0, 0)
	g := newGradient(Adaptive{}, now)
	if !g.probing || g.effective() != 3 {
		t.Fatalf("at start: probing %v at %v, want a probe at the floor 3", g.probing, g.effective())
	}
	rtt := 50 * time.Millisecond
	for i := range 10 {
		if g.observe(now, rtt, g.gen, 3) != (i == 9) || g.probing != (i < 9) {
			t.Fatalf("sample %d: probing %v", i+1, g.probing)
		}
	}
	if g.minRTT != rtt || g.effective() != 20 {
		t.Fatalf("after the first probe: min RTT %v, limit %v; want %v and the initial 20", g.minRTT, g.effective(), rtt)
	}
	// Run windows until the next probe starts.
	for !g.probing {
		now = now.Add(g.window)
		g.observe(now, rtt, g.gen, 10)
	}
	if want := g.limit / 2; g.effective() != float64(int(want)) {
		t.Errorf("second probe at %v, want half the limit %v", g.effective(), want)
	}
	for i := range 50 {
		g.observe(now, rtt, g.gen, 5)
		if g.probing != (i < 49) {
			t.Fatalf("second probe: probing %v after %d samples, want it to take 50", g.probing, i+1)
		}
	}
}

// A probe of fewer samples than 10 in all takes them all the first time.
func TestFirstProbeOfFewSamples(t *testing.T) {
	g := newGradient(Adaptive{MinRTTSamples: 4}, time.Unix(0, 0))
	if g.firstSamples != 4 {
		t.Errorf("first probe of %d samples, want 4", g.firstSamples)
	}
	if g := newGradient(Adaptive{MinRTTSamples: 200}, time.Unix(0, 0)); g.firstSamples != 40 {
		t.Errorf("first probe of %d samples, want 40", g.firstSamples)
	}
}

// At a high rate only about 2×sampleCap requests per window are timed,
// so admission and release mostly read no clock; every request of a probe
// is timed.
func TestGradientTimesOneInStride(t *testing.T) {
	t0 := time.Unix(0, 0)
	g := newGradient(Adaptive{}, t0)
	for range g.firstSamples { // the first probe: every request timed
		if !g.sampleNext() {
			t.Fatal("a probe request was not timed")
		}
		g.observe(t0, time.Millisecond, g.gen, 1)
	}
	if g.probing {
		t.Fatal("the probe did not end")
	}
	const perWindow = 20 * sampleCap
	now := t0
	for i := range perWindow {
		now = t0.Add(time.Duration(i) * g.window / perWindow)
		if g.sampleNext() {
			g.observe(now, time.Millisecond, g.gen, 1)
		}
	}
	g.observe(t0.Add(2*g.window), time.Millisecond, g.gen, 1) // ends the window
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
