package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// row is one JSON result: one phase of one configuration, medians over
// the runs. The metrics are null when the configuration is not judged.
type row struct {
	Row      int     `json:"row"`
	Limiter  string  `json:"limiter"`
	Limit    any     `json:"limit"` // the number for fixed, else "adaptive"
	Overload float64 `json:"overload"`
	RPS      float64 `json:"rps"`
	Phase    int     `json:"phase"`
	Slots    int     `json:"slots"`

	GoodputPct *float64 `json:"goodput_pct_of_capacity"`
	// GoodputDonePct attributes requests by completion time instead.
	GoodputDonePct *float64 `json:"goodput_by_completion_pct"`
	P99OKMs        *float64 `json:"p99_ok_ms"`
	// ConvergeMs is from the phase's start (the capacity change; for phase
	// 1, the run's start); -1 means not within the phase.
	ConvergeMs  *float64 `json:"converge_ms"`
	LimitMedian *int     `json:"limit_median"`
	LimitMin    *int     `json:"limit_min"`
	LimitMax    *int     `json:"limit_max"`

	Judged     bool   `json:"judged"`
	NotJudged  string `json:"not_judged,omitempty"`
	Runs       int    `json:"runs"`
	JudgedRuns int    `json:"judged_runs"`
	// Medians over all runs, judged or not, of what the load generator
	// achieved and what the server saw in the phase (by arrival time).
	AchievedRPS    float64 `json:"achieved_rps"`
	P99StartLagMs  float64 `json:"p99_start_lag_ms"`
	ServerArrived  float64 `json:"server_arrived"`
	ServerRejected float64 `json:"server_rejected"`
	ServerOK       float64 `json:"server_ok"`
	// Of the whole run: connections the load generator opened, and CPU
	// seconds of the load generator and of the server process.
	Dials        float64 `json:"loadgen_conns"`
	LoadCPUSec   float64 `json:"loadgen_cpu_s"`
	ServerCPUSec float64 `json:"server_cpu_s"`
}

func aggregate(ls limiterSpec, over, rps float64, runs []runResult) []row {
	judged := 0
	var worst loadCheck
	worst.Achieved = math.Inf(1)
	for _, r := range runs {
		if r.Load.Judged {
			judged++
		}
		if !r.Load.Judged && (r.Load.Achieved < worst.Achieved || r.Load.P99Lag > worst.P99Lag) {
			worst = r.Load
		}
	}
	ok := judged == len(runs)
	col := func(f func(runResult) float64) float64 {
		vs := make([]float64, len(runs))
		for i, r := range runs {
			vs[i] = f(r)
		}
		return median(vs)
	}
	nph := len(runs[0].Phases)
	out := make([]row, nph)
	for p := range nph {
		rw := row{
			Limiter: ls.String(), Limit: ls.limitLabel(), Overload: over, RPS: rps,
			Phase: p + 1, Slots: runs[0].Phases[p].Slots,
			Judged: ok, Runs: len(runs), JudgedRuns: judged,
			AchievedRPS:    col(func(r runResult) float64 { return r.Load.Achieved }),
			P99StartLagMs:  col(func(r runResult) float64 { return ms(r.Load.P99Lag) }),
			ServerArrived:  col(func(r runResult) float64 { return float64(r.Server[p].Arrived) }),
			ServerRejected: col(func(r runResult) float64 { return float64(r.Server[p].Rejected) }),
			ServerOK:       col(func(r runResult) float64 { return float64(r.Server[p].OK) }),
			Dials:          col(func(r runResult) float64 { return float64(r.Dials) }),
			LoadCPUSec:     col(func(r runResult) float64 { return r.LoadCPU.Seconds() }),
			ServerCPUSec:   col(func(r runResult) float64 { return r.ServerCPU.Seconds() }),
		}
		if !ok {
			rw.NotJudged = fmt.Sprintf("load generator behind schedule in %d of %d runs (worst: %.0f of %.0f req/s, p99 start lag %.0f ms)",
				len(runs)-judged, len(runs), worst.Achieved, rps, ms(worst.P99Lag))
			out[p] = rw
			continue
		}
		gp := round2(col(func(r runResult) float64 { return r.Phases[p].GoodputPct }))
		gpd := round2(col(func(r runResult) float64 { return r.Phases[p].GoodputDonePct }))
		p99 := col(func(r runResult) float64 { return nanIfNeg(ms(r.Phases[p].P99OK)) })
		conv := col(func(r runResult) float64 { return infIfNeg(ms(r.Phases[p].Converge)) })
		if math.IsInf(conv, 1) {
			conv = -1
		}
		lm := ints(runs, func(r runResult) int { return r.Phases[p].LimitMedian })
		lo := ints(runs, func(r runResult) int { return r.Phases[p].LimitMin })
		hi := ints(runs, func(r runResult) int { return r.Phases[p].LimitMax })
		rw.GoodputPct, rw.GoodputDonePct, rw.ConvergeMs = &gp, &gpd, &conv
		if !math.IsNaN(p99) {
			rw.P99OKMs = &p99
		}
		if lm >= 0 {
			rw.LimitMedian, rw.LimitMin, rw.LimitMax = &lm, &lo, &hi
		}
		out[p] = rw
	}
	return out
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

func ints(runs []runResult, f func(runResult) int) int {
	vs := make([]int, len(runs))
	for i, r := range runs {
		vs[i] = f(r)
	}
	slices.Sort(vs)
	return vs[len(vs)/2]
}

func ms(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return math.Round(float64(d)/1e5) / 10
}

func nanIfNeg(v float64) float64 {
	if v < 0 {
		return math.NaN()
	}
	return v
}

func infIfNeg(v float64) float64 {
	if v < 0 {
		return math.Inf(1)
	}
	return v
}

func fmtMs(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0fms", float64(d)/1e6)
}

// writeTable prints one line per configuration: goodput, p99 and
// convergence of each phase, and the limit's median in each phase.
func writeTable(w io.Writer, rows []row, o options) {
	fmt.Fprintf(w, "pool %v slots, %v per phase, %v per query, client timeout %v; medians of %d runs\n",
		o.W.Slots, o.W.Phase, o.W.Hold, o.Timeout, o.Runs)
	fmt.Fprintln(w, "goodput: 200s per second of the requests sent in the phase, % of the phase's capacity;")
	fmt.Fprintln(w, "p99: of the 200s; conv: from the phase's start to goodput within 5 % of its steady state (phase 1: from the run's start)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	nph := len(o.W.Slots)
	hdr := []string{"limiter", "load"}
	for p := range nph {
		s := fmt.Sprintf("p%d(%d)", p+1, o.W.Slots[p])
		hdr = append(hdr, s+" goodput", "p99", "conv", "limit")
	}
	fmt.Fprintln(tw, strings.Join(hdr, "\t")+"\t")
	for i := 0; i+nph <= len(rows); i += nph {
		r0 := rows[i]
		cells := []string{r0.Limiter, fmt.Sprintf("%gx", r0.Overload)}
		if !r0.Judged {
			fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t  not judged: "+r0.NotJudged)
			continue
		}
		for _, r := range rows[i : i+nph] {
			cells = append(cells, fmt.Sprintf("%.1f%%", *r.GoodputPct), optMs(r.P99OKMs), convCell(*r.ConvergeMs), limitCell(r))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	tw.Flush()
}

func optMs(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.0fms", *v)
}

func convCell(v float64) string {
	if v < 0 {
		return "never"
	}
	return fmt.Sprintf("%.0fms", v)
}

func limitCell(r row) string {
	if r.LimitMedian == nil {
		return "-"
	}
	return fmt.Sprintf("%d [%d-%d]", *r.LimitMedian, *r.LimitMin, *r.LimitMax)
}

// writeMarkdown writes the results as a Markdown table, one line per
// configuration, for the README.
func writeMarkdown(w io.Writer, rows []row, o options) {
	nph := len(o.W.Slots)
	var ph []string
	for p := range nph {
		ph = append(ph, fmt.Sprintf("%d", o.W.Slots[p]))
	}
	slots := strings.Join(ph, " / ")
	fmt.Fprintf(w, "| limiter | load | goodput %% (%s) | p99 ms | conv ms (start / changes) | limit (median) |\n", slots)
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for i := 0; i+nph <= len(rows); i += nph {
		r0 := rows[i]
		if !r0.Judged {
			fmt.Fprintf(w, "| %s | %gx | not judged: %s | | | |\n", r0.Limiter, r0.Overload, r0.NotJudged)
			continue
		}
		var gp, p99, conv, lim []string
		for _, r := range rows[i : i+nph] {
			gp = append(gp, fmt.Sprintf("%.1f", *r.GoodputPct))
			p99 = append(p99, strings.TrimSuffix(optMs(r.P99OKMs), "ms"))
			conv = append(conv, strings.TrimSuffix(convCell(*r.ConvergeMs), "ms"))
			if r.LimitMedian != nil {
				lim = append(lim, fmt.Sprintf("%d", *r.LimitMedian))
			} else {
				lim = append(lim, "-")
			}
		}
		fmt.Fprintf(w, "| %s | %gx | %s | %s | %s | %s |\n", r0.Limiter, r0.Overload,
			strings.Join(gp, " / "), strings.Join(p99, " / "), strings.Join(conv, " / "), strings.Join(lim, " / "))
	}
}
