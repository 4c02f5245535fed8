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
