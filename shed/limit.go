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
// The limit estimates how many requests the backend serves at once and
// allows a small queue on top, so that the backend never idles and nothing
// waits long. It needs the no-load latency L0 (how long a request takes when
// nothing queues), and, every Window, the rate X at which admitted requests
// complete and their mean latency (the sample):
//
//	queueing, and the limit refused requests:  limit = X × L0 × (1+Buffer) + 1
//	queueing, nothing refused:                 limit unchanged
//	no queue, limit in use:                    slow start (below)
//	limit mostly unused:                       limit unchanged
//
// where queueing means sample > L0 × (1+Buffer/2). The limit falls only in
// a window in which it refused (or queued) a request: a limit that refused
// nothing is not what holds the load back, and a server far below it loses
// nothing to requests that got slower, or to a no-load latency learnt from
// requests that were faster (the fast failures of a dead dependency).
//
// While requests queue the backend is busy, so X is its capacity and X × L0
// its real concurrency (Little's law): the limit lands on it, plus Buffer of
// it and one request of queue, in one window, however much capacity the
// backend lost. For a pool of 10 slots the limit settles at 12. When the
// backend has room (a window without queueing at a limit in use, or three
// requests admitted near the limit that did not queue and none that did for
// half a round trip), the limit grows by one per request that completes
// without queueing, doubling per round trip, until the first request that
// queued: the backend was serving about as many as were in flight when it
// was admitted, and the limit is set from that, never below where the
// growth started.
//
// L0 is measured without shedding at start: it is the mean latency of the
// first requests admitted while at most MinLimit were in flight, which
// cannot have queued behind one another; until it is known, the limit is
// InitialLimit. While the server uses less than half the limit, the requests
// admitted with at most MinLimit in flight (32 or more, at a window's end)
// raise L0 to their latency, so a minimum learnt from requests unlike
// today's does not stay. A window in which nine in ten requests are faster
// than L0 by a tenth lowers it (L0 was measured slow); one whose mean alone
// is faster, or faster calm requests, do not: they may be faster requests
// (fast failures), not the same ones measured slow, and a lower L0 could
// only cut the limit once the usual requests came back. A backend that
// becomes slower for good would look queued forever, so every MinRTTInterval
// (jittered, so that a fleet does not probe in step), and whenever ten
// windows in a row cut the limit, or find it at MinLimit, without the
// latency falling (a queue left by lost capacity drains in fewer), the limit
// is halved for MinRTTSamples requests, or ten and four windows if that is
// shorter, which then do not queue, and L0 is measured again from them. A
// periodic probe that falls due while less than half the limit is in use is
// put off: such a server measures L0 without one, and halving its limit
// could only shed.
//
// Why this one. Envoy's gradient controller (limit × L0 × (1+Buffer) /
// sample, plus √limit, clamped to a factor 2 and smoothed) settles at about
// 1.25 × the real concurrency plus its square root, a standing queue of a
// third, and takes about a second to follow a change of capacity; it probes
// at the floor at start, which sheds most traffic for a few hundred
// milliseconds. Gradient2 (Netflix) compares short- and long-term averages
// of latency, so a standing overload looks like no change and its limit
// drifts up with the queue. Vegas (Netflix) estimates the queue from the
// minimum latency ever seen, which a standing queue never refreshes. The
// completion rate measures the capacity directly, so a shrinking backend
// gets its new limit in one window, and slow start finds a grown one in a
// few round trips.
//
// It is cheap: a counter per request, one pass over the window's latencies
// per window; beyond about 500 requests per window only one in so many is
// timed, since a window keeps 256 latencies anyway and two clock reads per
// request would cost more than the admission.
type Adaptive struct {
	// InitialLimit is the limit until the no-load latency is known, brought
	// into [MinLimit, MaxLimit]. Zero means 20.
	InitialLimit int
	// MinLimit is the floor of the limit; at start, requests admitted
	// while at most this many are in flight measure the no-load latency.
	// Zero means 3.
	MinLimit int
	// MaxLimit is the ceiling of the limit, at least MinLimit. Zero means
	// 1000.
	MaxLimit int
	// Window is how often the limit is recomputed from the requests
	// completed, at least the no-load latency (so that the requests
	// admitted at one limit complete within the next window); a window ends
	// at the first completion after it. Zero means 50 ms.
	Window time.Duration
	// Percentile of the window's latencies taken as the sample, in (0, 1].
	// Zero means their mean, which Little's law ties to the concurrency: a
	// percentile misses a queue that only some requests wait in.
	Percentile float64
	// Buffer is the share of the backend's concurrency admitted as queue on
	// top of it, zero or more; latency above the no-load latency by more
	// than half of it counts as queueing. Zero means 0.1.
	Buffer float64
	// MinRTTInterval is how often the no-load latency is measured again,
	// plus up to 15 % of jitter. Zero means 60 s.
	MinRTTInterval time.Duration
	// MinRTTSamples is how many requests a measurement of the no-load
	// latency takes at half the limit, or at least ten and four windows,
	// if that ends it sooner. Zero means 50. At start it takes the first
	// requests admitted with at most MinLimit in flight instead.
	MinRTTSamples int
	// Smoothing is the weight of each window's computation in the limit, in
	// (0, 1]: the limit moves that share of the way to the new value.
	// Zero means 1, all the way: the completion rate measures the capacity,
	// where a gradient only says which way to go.
	Smoothing float64
}

// Defaults of Adaptive's limits.
const (
	defaultInitialLimit = 20
	defaultMinLimit     = 3
	defaultMaxLimit     = 1000
)

const sampleCap = 256 // latencies kept per window; beyond, the most recent

// calmCap is how many latencies of requests admitted at low load are kept
// to measure the no-load latency again; calmMin of them are enough.
const (
	calmCap = 64
	calmMin = 32
)

// controller is the adaptive limit described at Adaptive. It is not safe for
// concurrent use: the Shedder calls it with its mutex held.
type controller struct {
	min, max     float64
	window       time.Duration
	percentile   float64
	buffer       float64
	smoothing    float64
	probeEvery   time.Duration
	probeSamples int
	normalShare  float64 // of the limit, that Normal requests may fill

	limit  float64       // the steady-state limit
	minRTT time.Duration // the no-load latency; zero until known

	probing    bool
	probeLimit float64
	gen        uint32 // tokens carry it: only requests admitted during a probe measure the no-load latency
	probe      []time.Duration
	nextProbe  time.Time

	windowStart, windowEnd time.Time
	samples                [sampleCap]time.Duration
	seen                   int             // samples offered this window (may exceed sampleCap)
	light                  []time.Duration // before minRTT is known: latencies of requests admitted at <= min in flight
	done                   int             // requests released with their latency this window, timed or not
	// growing is slow start: with no queue at a limit in use, the limit
	// grows by one per request that completes without queueing, doubling
	// per round trip, until the first one that queued.
	growing  bool
	grewFrom float64 // the limit when growth started
	// roomy counts the requests admitted near the limit that did not queue
	// since lastQueued, when one that queued last completed.
	roomy       int
	lastQueued  time.Time
	queuedRun   int // requests in a row that queued
	maxInFlight int // highest in-flight count this window
	// pressed is set when the limit refused or queued a request this
	// window: only then may the window cut it. A limit that refused
	// nothing is not what holds the load back, and lowering it could only
	// shed what the backend serves.
	pressed bool
	// appLimited is set by update when the window used less than half the
	// limit.
	appLimited bool
	// calm holds the latencies of requests admitted with at most min in
	// flight during windows that used less than half the limit: they did
	// not queue behind one another, so they measure the no-load latency of
	// today's requests, without a probe and without shedding anything.
	calm  [calmCap]time.Duration
	calmN int

	// stale counts the windows in a row that cut the limit, or found it at
	// the floor, while the latency did not fall: the no-load latency may be
	// out of date.
	stale      int
	lastSample time.Duration

	// Only one request in stride is timed, outside a probe: at thousands
	// of requests per window, timing them all (two clock reads each) would
	// cost more than the admission itself, and a window keeps sampleCap
	// latencies anyway. stride is set at the end of each window from the
	// requests it saw, for about 2×sampleCap timed requests per window.
	stride, tick int
}

func newController(c Adaptive, normalShare float64, now time.Time) *controller {
	g := &controller{
		min:          float64(orInt(c.MinLimit, defaultMinLimit)),
		max:          float64(orInt(c.MaxLimit, defaultMaxLimit)),
		window:       orDur(c.Window, 50*time.Millisecond),
		percentile:   c.Percentile,
		buffer:       c.Buffer,
		probeEvery:   orDur(c.MinRTTInterval, 60*time.Second),
		probeSamples: orInt(c.MinRTTSamples, 50),
		smoothing:    c.Smoothing,
		normalShare:  normalShare,
	}
	// New has validated c: only the zero defaults are left to fill in.
	if g.smoothing == 0 {
		g.smoothing = 1
	}
	if g.buffer == 0 {
		g.buffer = 0.1
	}
	g.limit = clamp(float64(orInt(c.InitialLimit, defaultInitialLimit)), g.min, g.max)
	g.stride = 1
	g.probe = make([]time.Duration, 0, g.probeSamples)
	g.light = make([]time.Duration, 0, int(g.min))
	g.resetWindow(now, 0)
	return g
}

// cut lowers the limit to at most ceiling (within the floor) and stops a
// slow start: after a relief (Shedder.Relieve) the limit grows back from
// there as it does after any cut.
func (g *controller) cut(ceiling float64) {
	g.limit = clamp(min(g.limit, ceiling), g.min, g.max)
	g.growing = false
}

// effective returns the limit in force: the probe's while probing.
func (g *controller) effective() float64 {
	if g.probing {
		return g.probeLimit
	}
	return g.limit
}

func (g *controller) startProbe(now time.Time, limit float64) {
	g.probing = true
	g.probeLimit = clamp(math.Floor(limit), g.min, g.max)
	g.gen++
	g.probe = g.probe[:0]
	g.resetWindow(now, 0)
}

// sampleNext reports whether the request being admitted is to be timed:
// every one during a probe or before the no-load latency is known, one in
// stride otherwise.
func (g *controller) sampleNext() bool {
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
func (g *controller) admitted(inFlight int) {
	if inFlight > g.maxInFlight {
		g.maxInFlight = inFlight
	}
}

// completed counts a request released with its latency, timed or not: the
// window's completion rate.
func (g *controller) completed() { g.done++ }

// refused notes that the limit refused or queued a request: the window
// saw pressure, and only such a window may cut the limit.
func (g *controller) refused() { g.pressed = true }

// observe feeds the latency of a timed request admitted in generation gen
// with admittedAt in flight (itself included), and released at now with
// inFlight left. It reports whether the effective limit may have changed.
func (g *controller) observe(now time.Time, rtt time.Duration, gen uint32, admittedAt, inFlight int) bool {
	if g.probing {
		if gen == g.gen {
			g.probe = append(g.probe, rtt)
		}
		// A probe at a low limit on a slow backend would take long: four
		// windows and ten samples are enough.
		if n := len(g.probe); n < g.probeSamples && (n < 10 || now.Sub(g.windowStart) < 4*g.span()) {
			return false
		}
		g.minRTT = g.sampleOf(g.probe)
		g.probing = false
		g.gen++
		g.scheduleProbe(now)
		g.stride = 1
		g.resetWindow(now, inFlight)
		return true
	}
	if admittedAt <= int(g.min) {
		if g.minRTT == 0 && len(g.light) < cap(g.light) {
			g.light = append(g.light, rtt)
		}
		g.calm[g.calmN%calmCap] = rtt
		g.calmN++
	}
	// Two requests in a row that queued, not one: a single slow request
	// is as often a scheduler's hiccup as a queue.
	queued := false
	if g.minRTT > 0 {
		if g.queued(rtt) {
			g.queuedRun++
		} else {
			g.queuedRun = 0
		}
		queued = g.queuedRun >= 2
	}
	if !g.growing && g.minRTT > 0 {
		// Requests admitted near the limit that did not queue, and none that
		// did for half a round trip: the backend has room now. Waiting for
		// the window to say so would cost one.
		switch {
		case queued:
			g.lastQueued, g.roomy = now, 0
		case g.queuedRun == 0 && float64(admittedAt) >= 0.8*g.limit:
			if g.roomy++; g.roomy >= 3 && now.Sub(g.lastQueued) >= g.minRTT/2 {
				g.startGrowing()
			}
		}
	}
	if g.growing {
		if queued {
			// The backend is full: it was serving about admittedAt-1 when
			// this request came.
			// Never below where growth started: one request slowed by
			// something else than a queue must not undo what is known.
			g.growing = false
			g.limit = clamp(max(g.target(float64(admittedAt-1)), g.grewFrom), g.min, g.max)
			g.resetWindow(now, inFlight)
			return true
		}
		if g.queuedRun == 0 {
			g.limit = clamp(g.limit+float64(g.stride), g.min, g.max)
		}
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
	if g.minRTT == 0 {
		if len(g.light) == 0 {
			// No request was admitted at low load (they all went away):
			// measure it the old way, at the floor.
			g.startProbe(now, g.min)
			return true
		}
		g.minRTT = g.sampleOf(g.light)
		g.scheduleProbe(now)
	}
	g.update(now)
	g.stride = max(1, g.seen*g.stride/(2*sampleCap))
	g.resetWindow(now, inFlight)
	if !now.Before(g.nextProbe) && g.appLimited {
		// A probe halves the limit; a server that uses less than half of
		// it needs none (its calm requests measure the no-load latency),
		// and could only lose requests to it.
		g.scheduleProbe(now)
	}
	if g.stale >= staleWindows || !now.Before(g.nextProbe) {
		g.stale = 0
		g.startProbe(now, g.limit/2)
	}
	return true
}

func (g *controller) scheduleProbe(now time.Time) {
	jitter := time.Duration(rand.Int64N(int64(g.probeEvery)*15/100 + 1))
	g.nextProbe = now.Add(g.probeEvery + jitter)
}

func (g *controller) resetWindow(now time.Time, inFlight int) {
	g.seen, g.done = 0, 0
	g.maxInFlight = inFlight
	g.pressed = false
	g.windowStart, g.windowEnd = now, now.Add(g.span())
}

// update recomputes the limit from the window's samples.
func (g *controller) update(now time.Time) {
	n := min(g.seen, sampleCap)
	if n == 0 || g.minRTT <= 0 {
		return
	}
	g.appLimited = float64(g.maxInFlight) < g.limit/2
	if g.appLimited {
		// App-limited: the window says nothing about a limit we do not
		// use, but its calm requests say what a request costs today. A
		// minimum learnt from other requests (the fast failures of a dead
		// dependency) would make every healthy request look queued. They
		// only raise it: calm requests that are faster may be fast
		// failures too, and a lower no-load latency would cut the limit
		// below the backend's concurrency once the usual requests are
		// back under load. A probe, under load, lowers it.
		g.growing = false
		if n := min(g.calmN, calmCap); n >= calmMin {
			g.minRTT = max(g.minRTT, g.sampleOf(g.calm[:n]))
			g.calmN = 0
			g.scheduleProbe(now)
		}
		return
	}
	g.calmN = 0 // a window in use: the calm requests of a busy server are few and far between
	elapsed := now.Sub(g.windowStart)
	if elapsed <= 0 || elapsed > 4*g.span() {
		// A window that idled for long says nothing about the rate.
		return
	}
	sample := g.sampleOf(g.samples[:n])
	if sample < g.minRTT*9/10 && percentileOf(g.samples[:n], 0.9) < g.minRTT*9/10 {
		// Nine in ten requests faster than the no-load latency by a
		// tenth: that one was measured slow. A window whose mean alone is
		// faster does not lower it: some of its requests were faster ones
		// (fast failures), not the same ones measured slow, and a lower
		// no-load latency could only cut the limit once the usual
		// requests came back.
		g.minRTT = sample
	}
	if !g.queued(sample) {
		// No queue at the limit in use: the backend may have room.
		g.startGrowing()
		return
	}
	g.growing = false
	if !g.pressed {
		// Slower, but nothing was refused: the limit is not what holds
		// the load back, and a server below its limit loses nothing to
		// a slower mix of requests. Lowering the limit here could only
		// shed requests the backend would serve.
		return
	}
	rate := float64(g.done) / elapsed.Seconds()
	next := g.target(rate * g.minRTT.Seconds())
	// At the floor the limit cannot be cut, and with a no-load latency
	// that is too low the floor is where the rate puts it again: a queue
	// that does not drain there counts too.
	if (next < 0.9*g.limit || g.limit <= g.min) && g.lastSample > 0 && sample >= g.lastSample*97/100 {
		g.stale++
	} else {
		g.stale = 0
	}
	g.lastSample = sample
	next = g.limit*(1-g.smoothing) + next*g.smoothing
	g.limit = clamp(next, g.min, g.max)
}

func (g *controller) startGrowing() {
	if !g.growing {
		g.growing, g.grewFrom = true, g.limit
	}
}

// target returns the limit for a backend that serves concurrency requests
// at once: Normal requests, which fill normalShare of the limit, get that
// and Buffer of it, plus one request of queue; higher priorities can queue
// a little more.
func (g *controller) target(concurrency float64) float64 {
	return (concurrency*(1+g.buffer) + 1) / g.normalShare
}

// staleWindows is how many windows in a row must cut the limit without the
// latency falling before the no-load latency is measured again: more than
// a queue takes to drain after the backend lost capacity, which also cuts
// the limit while the latency stays high for a few round trips.
const staleWindows = 10

// queued reports whether a latency shows queueing.
func (g *controller) queued(d time.Duration) bool {
	return float64(d) > float64(g.minRTT)*(1+g.buffer/2)
}

// span is a window's length: Window, but at least the no-load latency, so
// that the requests admitted at one limit complete within the next window.
func (g *controller) span() time.Duration { return max(g.window, g.minRTT) }

// sampleOf returns the Percentile of s, or its mean when Percentile is
// zero. It may reorder s.
func (g *controller) sampleOf(s []time.Duration) time.Duration {
	if g.percentile > 0 {
		return percentileOf(s, g.percentile)
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return sum / time.Duration(len(s))
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
