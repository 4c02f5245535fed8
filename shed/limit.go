package shed

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Adaptive configures the adaptive concurrency limit, used when Config.Limit
// is zero. Its zero value is the recommended configuration: no field needs
// tuning for a particular backend. Like Config, it is read once by New.
//
// The algorithm is Envoy's gradient controller (the adaptive concurrency
// filter). Every Window it takes a percentile of the latencies of the
// requests released during the window (the sample RTT) and compares it with
// the no-load latency (the min RTT):
//
//	gradient = clamp((minRTT × (1+Buffer)) / sampleRTT, 0.5, 2)
//	limit    = limit×gradient + √(limit×gradient)
//
// When the backend queues, latency grows past minRTT×(1+Buffer), the gradient
// falls below 1 and the limit shrinks; when it does not, the limit grows. The
// fixed point is about (1+Buffer)×C + √((1+Buffer)×C) for a backend of real
// concurrency C (16 for C = 10): the small standing queue that keeps the
// backend busy, and no more.
//
// Why this one. Gradient2 (Netflix) compares short- and long-term averages
// of latency, so a steady overload looks like no change and its limit drifts
// up: it detects latency increases, not a queue. Vegas (Netflix) estimates
// the queue from the minimum latency ever seen, which under a standing
// overload is never refreshed. Envoy's controller measures the no-load
// latency on purpose: at start and then every MinRTTInterval (jittered, so
// that a fleet does not probe in step) it lowers the limit for
// MinRTTSamples requests so that nothing queues, and takes the min RTT from
// those. It is also cheap: one percentile per window, no work per request
// beyond storing a sample; and beyond about 500 requests per window only
// one in so many is timed (every one during a probe), since a window keeps
// 256 latencies anyway and two clock reads per request would cost more
// than the admission.
//
// One change from Envoy: Envoy probes at the floor (MinLimit), which sheds
// most traffic during every probe. Here only the first probe, when nothing
// is known, uses the floor, and for a fifth of the samples (see
// MinRTTSamples); later probes use half the current limit, which is below
// the backend's real concurrency whenever the limit has converged (the
// fixed point above is under 2C), so the backend still does not queue, at
// a fraction of the cost. The limit does not grow while the server uses
// less than half of it (as in Netflix's limiters), so an idle period does not
// inflate it.
type Adaptive struct {
	// InitialLimit is the limit used after the first min-RTT probe, brought
	// into [MinLimit, MaxLimit]. Zero means 20.
	InitialLimit int
	// MinLimit is the floor of the limit and the concurrency of the first
	// min-RTT probe. Zero means 3.
	MinLimit int
	// MaxLimit is the ceiling of the limit, at least MinLimit. Zero means
	// 1000.
	MaxLimit int
	// Window is how often the limit is recomputed from the latencies seen.
	// Zero means 100 ms.
	Window time.Duration
	// Percentile of the window's latencies taken as the sample RTT, in (0, 1].
	// Zero means 0.5 (the median, robust to a few slow requests).
	Percentile float64
	// Buffer is the share of the min RTT tolerated as queueing before the
	// limit shrinks, zero or more. Zero means 0.25; for almost none, use a
	// small value such as 0.01.
	Buffer float64
	// MinRTTInterval is how often the min RTT is measured again, plus up to
	// 15 % of jitter. Zero means 60 s.
	MinRTTInterval time.Duration
	// MinRTTSamples is how many requests a min-RTT probe measures. Zero
	// means 50. The first probe, at the floor, measures a fifth of them
	// (at least 10, or all of them if fewer): it sheds most traffic while
	// it runs, at every start of the process, and the median of 10
	// requests that do not queue is already close to the no-load latency;
	// the next probe, at half the limit, measures them all.
	MinRTTSamples int
	// Smoothing is the weight of each new computation in the limit, in
	// (0, 1]: the limit moves that share of the way to the new value per
	// Window. Zero means 0.2.
	Smoothing float64
}

// Defaults of Adaptive's limits.
const (
	defaultInitialLimit = 20
	defaultMinLimit     = 3
	defaultMaxLimit     = 1000
)

const sampleCap = 256 // latencies kept per window; beyond, the most recent

// gradient is Envoy's gradient controller. It is not safe for concurrent
// use: the Shedder calls it with its mutex held.
type gradient struct {
	initial, min, max float64
	window            time.Duration
	percentile        float64
	buffer            float64
	smoothing         float64
	probeEvery        time.Duration
	probeSamples      int
	firstSamples      int // of the first probe

	limit  float64       // the steady-state limit
	minRTT time.Duration // zero until the first probe ends

	probing    bool
	probeLimit float64
	gen        uint32 // tokens carry it: only requests admitted during a probe measure the min RTT
	probe      []time.Duration
	nextProbe  time.Time

	windowEnd   time.Time
	samples     [sampleCap]time.Duration
	seen        int // samples offered this window (may exceed sampleCap)
	maxInFlight int // highest in-flight count this window

	// Only one request in stride is timed, outside a probe: at thousands
	// of requests per window, timing them all (two clock reads each) would
	// cost more than the admission itself, and a window keeps sampleCap
	// latencies anyway. stride is set at the end of each window from the
	// requests it saw, for about 2×sampleCap timed requests per window.
	stride, tick int
}

func newGradient(c Adaptive, now time.Time) *gradient {
	g := &gradient{
		initial:      float64(orInt(c.InitialLimit, defaultInitialLimit)),
		min:          float64(orInt(c.MinLimit, defaultMinLimit)),
		max:          float64(orInt(c.MaxLimit, defaultMaxLimit)),
		window:       orDur(c.Window, 100*time.Millisecond),
		percentile:   c.Percentile,
		buffer:       c.Buffer,
		probeEvery:   orDur(c.MinRTTInterval, 60*time.Second),
		probeSamples: orInt(c.MinRTTSamples, 50),
		smoothing:    c.Smoothing,
	}
	// New has validated c: only the zero defaults are left to fill in.
	if g.smoothing == 0 {
		g.smoothing = 0.2
	}
	if g.percentile == 0 {
		g.percentile = 0.5
	}
	if g.buffer == 0 {
		g.buffer = 0.25
	}
	g.limit = clamp(g.initial, g.min, g.max)
	g.stride = 1
	g.firstSamples = min(g.probeSamples, max(10, g.probeSamples/5))
	g.probe = make([]time.Duration, 0, g.probeSamples)
	g.startProbe(now, g.min)
	return g
}

// effective returns the limit in force: the probe's while probing.
func (g *gradient) effective() float64 {
	if g.probing {
		return g.probeLimit
	}
	return g.limit
}

func (g *gradient) startProbe(now time.Time, limit float64) {
	g.probing = true
	g.probeLimit = clamp(math.Floor(limit), g.min, g.max)
	g.gen++
	g.probe = g.probe[:0]
	g.windowEnd = now.Add(g.window)
}

// sampleNext reports whether the request being admitted is to be timed:
// every one during a probe, one in stride otherwise.
func (g *gradient) sampleNext() bool {
	if g.probing || g.stride <= 1 {
		return true
	}
	if g.tick++; g.tick >= g.stride {
		g.tick = 0
		return true
	}
	return false
}

// admitted notes the in-flight count after an admission.
func (g *gradient) admitted(inFlight int) {
	if inFlight > g.maxInFlight {
		g.maxInFlight = inFlight
	}
}

// observe feeds the latency of a request admitted in generation gen and
// released at now. It reports whether the effective limit may have changed.
func (g *gradient) observe(now time.Time, rtt time.Duration, gen uint32, inFlight int) bool {
	if g.probing {
		if gen == g.gen {
			g.probe = append(g.probe, rtt)
		}
		want := g.probeSamples
		if g.minRTT == 0 {
			want = g.firstSamples // nothing is known yet: see Adaptive.MinRTTSamples
		}
		if len(g.probe) < want {
			return false
		}
		g.minRTT = percentileOf(g.probe, g.percentile)
		g.probing = false
		g.gen++
		jitter := time.Duration(rand.Int64N(int64(g.probeEvery)*15/100 + 1))
		g.nextProbe = now.Add(g.probeEvery + jitter)
		g.stride = 1
		g.resetWindow(now, inFlight)
		return true
	}
	if g.seen < sampleCap {
		g.samples[g.seen] = rtt
	} else {
		g.samples[g.seen%sampleCap] = rtt
	}
	g.seen++
	if now.Before(g.windowEnd) {
		return false
	}
	g.update()
	g.stride = max(1, g.seen*g.stride/(2*sampleCap))
	g.resetWindow(now, inFlight)
	if !now.Before(g.nextProbe) {
		g.startProbe(now, g.limit/2)
	}
	return true
}

func (g *gradient) resetWindow(now time.Time, inFlight int) {
	g.seen = 0
	g.maxInFlight = inFlight
	g.windowEnd = now.Add(g.window)
}

// update recomputes the limit from the window's samples.
func (g *gradient) update() {
	n := min(g.seen, sampleCap)
	if n == 0 || g.minRTT <= 0 {
		return
	}
	sample := percentileOf(g.samples[:n], g.percentile)
	if sample <= 0 {
		sample = 1
	}
	grad := clamp(float64(g.minRTT)*(1+g.buffer)/float64(sample), 0.5, 2)
	next := g.limit * grad
	next += math.Sqrt(next)
	if next > g.limit && float64(g.maxInFlight) < g.limit/2 {
		return // app-limited: latency says nothing about a limit we do not use
	}
	next = g.limit*(1-g.smoothing) + next*g.smoothing
	g.limit = clamp(next, g.min, g.max)
}

// percentileOf sorts s in place and returns its q-th percentile.
func percentileOf(s []time.Duration, q float64) time.Duration {
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func clamp(v, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, v)) }

// orInt returns v, or def when v is zero. New has refused negative values.
func orInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// orDur returns v, or def when v is zero. New has refused negative values.
func orDur(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}
