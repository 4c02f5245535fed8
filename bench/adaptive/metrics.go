package main

import (
	"math"
	"slices"
	"time"
)

// bucket is the width of the goodput time series used for convergence.
const bucket = 100 * time.Millisecond

// convergeRun is how many consecutive buckets must be in band for goodput
// to count as converged, so that one bucket crossing the band during an
// oscillation is not taken for convergence.
const convergeRun = 3

// phaseMetrics is the result of one phase of one run.
type phaseMetrics struct {
	Phase int // 1-based
	Slots int
	// Sent is the number of requests scheduled in the phase; OK those of them
	// answered 200 within the timeout.
	Sent, OK int
	// GoodputPct is OK per second over the phase's capacity (Slots / Hold
	// per second), in percent. A request counts in the phase it was sent in.
	GoodputPct float64
	// GoodputDonePct is the same with requests counted in the phase they
	// completed in instead.
	GoodputDonePct float64
	// P99OK is the 99th percentile latency of the 200s sent in the phase
	// (NaN if none).
	P99OK time.Duration
	// Converge is the time from the phase's start (a capacity change, or the
	// run's start for phase 1) to the end of the first of convergeRun
	// consecutive 100 ms buckets whose goodput, by completion time, is within
	// 5 % (at least one request) of the phase's steady state; -1 if never
	// within the phase.
	Converge time.Duration
	// Steady is the phase's steady-state goodput per bucket: the median
	// bucket of the phase's second half.
	Steady float64
	// LimitMedian, LimitMin and LimitMax summarise the limiter's limit as
	// sampled during the phase (-1 when it exposes none).
	LimitMedian, LimitMin, LimitMax int
}

// loadCheck says whether the load generator kept its schedule.
type loadCheck struct {
	Achieved float64       // requests started within the schedule's span, per second
	Target   float64       // scheduled rate
	P99Lag   time.Duration // p99 of start - scheduled
	Judged   bool
}

// Thresholds beyond which a run is not judged: the load generator did not
// send the load it was asked for.
const (
	minAchievedRatio = 0.95
	maxP99Lag        = 50 * time.Millisecond
)

func checkLoad(recs []record, rps float64, span time.Duration) loadCheck {
	c := loadCheck{Target: rps}
	if len(recs) == 0 {
		return c
	}
	in := 0
	lags := make([]time.Duration, len(recs))
	for i, r := range recs {
		if r.Start <= span {
			in++
		}
		lags[i] = r.Start - r.Sched
	}
	c.Achieved = float64(in) / span.Seconds()
	c.P99Lag = percentile(lags, 0.99)
	c.Judged = c.Achieved >= minAchievedRatio*rps && c.P99Lag <= maxP99Lag
	return c
}

// analyze computes the per-phase metrics of one run from the client's
// records and the server's limit samples.
func analyze(recs []record, w workload, timeout time.Duration, samples []limitSample) []phaseMetrics {
	nph := len(w.Slots)
	out := make([]phaseMetrics, nph)
	oks := make([][]time.Duration, nph)
	nb := int((w.total() + timeout + bucket) / bucket)
	buckets := make([]float64, nb)
	for _, r := range recs {
		p := w.phaseOf(r.Sched)
		out[p].Sent++
		if r.Status != 200 || r.Lat > timeout {
			continue
		}
		out[p].OK++
		oks[p] = append(oks[p], r.Lat)
		if b := int(r.completion() / bucket); b >= 0 && b < nb {
			buckets[b]++
		}
	}
	perPhase := int(w.Phase / bucket)
	for p := range out {
		m := &out[p]
		m.Phase, m.Slots = p+1, w.Slots[p]
		capacity := float64(w.Slots[p]) / w.Hold.Seconds() // per second
		m.GoodputPct = 100 * float64(m.OK) / w.Phase.Seconds() / capacity
		m.P99OK = percentile(oks[p], 0.99)
		first := p * perPhase
		var done float64
		for _, v := range buckets[first : first+perPhase] {
			done += v
		}
		m.GoodputDonePct = 100 * done / w.Phase.Seconds() / capacity
		m.Steady = median(buckets[first+perPhase/2 : first+perPhase])
		m.Converge = converge(buckets[first:first+perPhase], m.Steady)
		m.LimitMedian, m.LimitMin, m.LimitMax = limitStats(samples, w, p)
	}
	return out
}

// converge returns the end of the first bucket of the first run of
// convergeRun buckets within band of steady, measured from the first
// bucket's start; -1 if there is none. A run cut short by the end of bs
// counts if every bucket it has is in band.
func converge(bs []float64, steady float64) time.Duration {
	band := math.Max(0.05*steady, 1)
	in := func(v float64) bool { return math.Abs(v-steady) <= band }
	for i := range bs {
		ok := true
		for j := i; j < min(i+convergeRun, len(bs)); j++ {
			if !in(bs[j]) {
				ok = false
				break
			}
		}
		if ok {
			return time.Duration(i+1) * bucket
		}
	}
	return -1
}

func limitStats(samples []limitSample, w workload, p int) (med, lo, hi int) {
	var ls []int
	for _, s := range samples {
		if w.phaseOf(s.T) == p && s.T < w.total() {
			ls = append(ls, s.Limit)
		}
	}
	if len(ls) == 0 {
		return -1, -1, -1
	}
	slices.Sort(ls)
	return ls[len(ls)/2], ls[0], ls[len(ls)-1]
}

// percentile is the nearest-rank q-quantile of ds (NaN duration -1 if
// empty). It sorts ds.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return -1
	}
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

// median of vs (0 if empty), leaving vs as it was.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
