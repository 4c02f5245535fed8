package lab

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// quietLate and busyLate are what the probe saw on a quiet machine and on
// one with 8 busy loops on its 2 cores.
var (
	quietLate = lateness{samples: 1800, p99: 300 * time.Microsecond, max: 2 * time.Millisecond}
	busyLate  = lateness{samples: 600, p99: 65 * time.Millisecond, max: 95 * time.Millisecond}
)

func TestScheduleKept(t *testing.T) {
	for _, tc := range []struct {
		name         string
		s            schedule
		kept         bool
		reasonWants  []string
		reasonLeaves []string
	}{
		{"on schedule", schedule{rate: 300, want: 300, lagP99: 2 * time.Millisecond, maxLag: 50 * time.Millisecond}, true, nil, nil},
		{"at the edges", schedule{rate: 285, want: 300, lagP99: 50 * time.Millisecond, maxLag: 50 * time.Millisecond}, true, nil, nil},
		{"rate short", schedule{run: "adaptive", rate: 284, want: 300, lagP99: time.Millisecond, maxLag: 50 * time.Millisecond}, false,
			[]string{"(adaptive)", "send rate 284.0 rps of 300 (want >= 95%)"}, []string{"lag"}},
		{"lag long", schedule{rate: 300, want: 300, lagP99: 51 * time.Millisecond, maxLag: 50 * time.Millisecond}, false,
			[]string{"p99 start lag 51ms (want <= 50ms)"}, []string{"send rate"}},
		{"both", schedule{rate: 10, want: 300, lagP99: time.Second, maxLag: 50 * time.Millisecond}, false,
			[]string{"send rate 10.0 rps", "p99 start lag 1s"}, nil},
		{"nothing sent", schedule{want: 300, maxLag: 50 * time.Millisecond}, false, []string{"send rate 0.0 rps"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.kept(); got != tc.kept {
				t.Fatalf("kept() = %v, want %v", got, tc.kept)
			}
			if tc.kept {
				return
			}
			why := tc.s.reason()
			for _, w := range tc.reasonWants {
				if !strings.Contains(why, w) {
					t.Errorf("reason %q lacks %q", why, w)
				}
			}
			for _, w := range tc.reasonLeaves {
				if strings.Contains(why, w) {
					t.Errorf("reason %q names %q, which held", why, w)
				}
			}
		})
	}
}

// ticks returns n probe samples of lateness d.
func ticks(n int, d time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

func TestLatenessQuiet(t *testing.T) {
	for _, tc := range []struct {
		name  string
		late  []time.Duration
		p99   time.Duration
		quiet bool
	}{
		{"quiet", ticks(1000, 100*time.Microsecond), 100 * time.Microsecond, true},
		{"at the bound", ticks(1000, quietBound), quietBound, true},
		{"above the bound", ticks(1000, quietBound+time.Microsecond), quietBound + time.Microsecond, false},
		// A few short hiccups sit in the last percent of the time.
		{"rare hiccups", append(ticks(1000, 100*time.Microsecond), ticks(3, 2*time.Millisecond)...), 100 * time.Microsecond, true},
		// One stall of 100 ms swallows a tenth of a second's ticks: it is
		// a tenth of the time, not one sample in a thousand.
		{"one long stall", append(ticks(1000, 100*time.Microsecond), 100*time.Millisecond), 100 * time.Millisecond, false},
		{"busy", ticks(600, 65*time.Millisecond), 65 * time.Millisecond, false},
		{"no sample", nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := measureLateness(tc.late, probeTick)
			if l.p99 != tc.p99 {
				t.Errorf("p99 %v, want %v", l.p99, tc.p99)
			}
			if got := l.quiet(); got != tc.quiet {
				t.Errorf("quiet() = %v, want %v (%v)", got, tc.quiet, l)
			}
			if !tc.quiet && !strings.Contains(l.reason("row"), "(row)") {
				t.Errorf("reason %q does not name the run", l.reason("row"))
			}
		})
	}
	if why := busyLate.reason(""); !strings.Contains(why, "p99 65ms") || !strings.Contains(why, "want p99 <= 10ms") {
		t.Errorf("reason %q lacks the lateness and the bound", why)
	}
	// Every core taken: the timer wakes promptly, the CPU is not there.
	for _, tc := range []struct {
		wait  float64
		quiet bool
	}{{-1, true}, {0, true}, {maxCPUWait, true}, {0.97, false}} {
		l := lateness{samples: 1000, p99: time.Millisecond, cpuWait: tc.wait}
		if l.quiet() != tc.quiet {
			t.Errorf("CPU wait %v: quiet() = %v, want %v", tc.wait, l.quiet(), tc.quiet)
		}
		if !tc.quiet && !strings.Contains(l.reason(""), "tasks waited for a CPU 97% of the time (want <= 50%)") {
			t.Errorf("reason %q lacks the CPU wait and its bound", l.reason(""))
		}
	}
}

func TestCPUWait(t *testing.T) {
	t0 := time.Unix(1000, 0)
	marks := []stallMark{{t0, 0}, {t0.Add(time.Second), 100 * time.Millisecond}, {t0.Add(2 * time.Second), 1100 * time.Millisecond}}
	for _, tc := range []struct {
		marks []stallMark
		until time.Time
		want  float64
	}{
		{marks, time.Time{}, 0.55},
		{marks, t0.Add(1500 * time.Millisecond), 0.1},
		{marks, t0.Add(500 * time.Millisecond), -1},
		{marks[:1], time.Time{}, -1},
		{nil, time.Time{}, -1},
		{[]stallMark{{t0, time.Second}, {t0.Add(time.Second), 0}}, time.Time{}, -1}, // a counter going back
		{[]stallMark{{t0, 0}, {t0.Add(time.Second), 5 * time.Second}}, time.Time{}, 1},
	} {
		if got := cpuWait(tc.marks, tc.until); got != tc.want {
			t.Errorf("cpuWait(%v, %v) = %v, want %v", tc.marks, tc.until, got, tc.want)
		}
	}
}

func TestParseCPUPressure(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"some avg10=19.53 avg60=19.39 avg300=41.80 total=2621281596\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 2621281596 * time.Microsecond, true},
		{"full avg10=0.00 total=5\nsome total=7\n", 7 * time.Microsecond, true},
		{"", 0, false},
		{"some avg10=1.00\n", 0, false},
		{"some total=-1\n", 0, false},
		{"some total=99999999999999999999\n", 0, false},
		{"some total=9223372036854776\n", 0, false}, // overflows as a Duration
		{"some total=x\n", 0, false},
	} {
		got, ok := parseCPUPressure(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseCPUPressure(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzParseCPUPressure(f *testing.F) {
	f.Add("some avg10=19.53 avg60=19.39 avg300=41.80 total=2621281596\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	f.Add("some total=9223372036854775807")
	f.Add("some\n\n total=")
	f.Fuzz(func(t *testing.T, s string) {
		if d, ok := parseCPUPressure(s); ok && d < 0 {
			t.Errorf("parseCPUPressure(%q) = %v, negative", s, d)
		}
	})
}

// The probe samples until stopped, and before keeps the samples of the
// part of the run that is judged. In a bubble, timers are never late.
func TestQuietProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		q := probeQuiet(context.Background())
		time.Sleep(100 * time.Millisecond)
		l := q.before(start.Add(40 * time.Millisecond))
		if l.samples < 38 || l.samples > 40 || !l.quiet() {
			t.Errorf("before 40ms: %d samples (%v), want about 40, quiet", l.samples, l)
		}
		if l := q.stop(); l.samples < 98 || l.samples > 101 || l.p99 != 0 || !l.quiet() {
			t.Errorf("stop: %d samples (%v), want about 100, none late", l.samples, l)
		}
		if a, b := q.stop(), q.stop(); a != b {
			t.Errorf("stop twice: %v then %v", a, b)
		}
	})
}

func TestTimed(t *testing.T) {
	kept := schedule{rate: 300, want: 300, maxLag: 10 * time.Millisecond}
	behind := schedule{run: "row", rate: 100, want: 300, maxLag: 10 * time.Millisecond}
	for _, tc := range []struct {
		name string
		pre  *timing
		ok   bool
		want Verdict
		why  []string
	}{
		{"held, ok", (&timing{}).needSchedule(kept).needQuiet("", quietLate), true, Pass, nil},
		{"held, not ok", (&timing{}).needSchedule(kept).needQuiet("", quietLate), false, Fail, nil},
		{"behind, not ok", (&timing{}).needSchedule(behind).needQuiet("", quietLate), false, NotJudged, []string{"send rate 100.0 rps of 300"}},
		{"busy, ok", (&timing{}).needSchedule(kept).needQuiet("row", busyLate), true, NotJudged, []string{"timer lateness p99 65ms"}},
		{"both", (&timing{}).needSchedule(behind).needQuiet("row", busyLate), false, NotJudged, []string{"send rate", "timer lateness"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Result{}
			r.timed(tc.pre, tc.ok, "check", "measured %d", 7)
			c := r.Checks[0]
			if c.Verdict != tc.want {
				t.Fatalf("verdict %v (%s), want %v", c.Verdict, c.Detail, tc.want)
			}
			if tc.want != NotJudged && c.Detail != "measured 7" {
				t.Errorf("detail %q, want the check's own", c.Detail)
			}
			for _, w := range tc.why {
				if !strings.Contains(c.Detail, w) {
					t.Errorf("detail %q lacks %q", c.Detail, w)
				}
			}
		})
	}
}

// mustNotFail fails the test for every check of r that failed, and
// returns how many were not judged.
func mustNotFail(t *testing.T, r *Result) int {
	t.Helper()
	for _, c := range r.Failed() {
		t.Errorf("failed on a busy machine: %s: %s", c.Name, c.Detail)
	}
	return len(r.NotJudged())
}

// The capacity rows once failed "adaptive p99 within a fifth of the client
// timeout" at 214 ms against 200 on a busy machine whose load kept its
// schedule: the same numbers are not judged when the machine was too busy
// to time them, and still fail on a quiet one.
func TestCapacityBusyMachineIsNotJudged(t *testing.T) {
	p := shedParams{service: 50 * time.Millisecond, cap: capacityParams{overloads: []float64{10}, phases: []int{10, 5, 20}, fixed: []int{30},
		phase: time.Second, timeout: time.Second}}
	capacity0 := 200.0
	runs := func(late lateness) []*capacityRun {
		var out []*capacityRun
		for _, l := range []int{0, 30} {
			run := &capacityRun{label: "adaptive", limit: l, overload: 10,
				res: shedResult{sendRate: 2000, lagP99: time.Millisecond, late: late}}
			for k, slots := range p.cap.phases {
				run.phases = append(run.phases, capacityPhase{slots: slots, goodputPct: 95, ok: 100,
					p99: []time.Duration{102, 214, 120}[k] * time.Millisecond, converge: 200 * time.Millisecond})
			}
			for range 3 * int(p.cap.phase/limitStep) {
				run.limits = append(run.limits, 12)
			}
			out = append(out, run)
		}
		return out
	}
	busy := &Result{}
	p.capacityChecks(busy, runs(busyLate), capacity0)
	if n := mustNotFail(t, busy); n != 5 {
		t.Errorf("%d checks not judged, want the 5 of the overload: %v", n, busy.Checks)
	}
	for _, c := range busy.Checks {
		if !strings.Contains(c.Detail, "timer lateness p99 65ms") {
			t.Errorf("%s: detail %q does not say which precondition failed", c.Name, c.Detail)
		}
	}
	quiet := &Result{}
	p.capacityChecks(quiet, runs(quietLate), capacity0)
	var failed []string
	for _, c := range quiet.Failed() {
		failed = append(failed, c.Name)
	}
	if len(quiet.NotJudged()) > 0 || !strings.Contains(strings.Join(failed, ";"), "adaptive p99 within a fifth") {
		t.Errorf("quiet machine: failed %v, not judged %v; want the p99 failed, everything judged", failed, quiet.NotJudged())
	}
}

// The shedding rows' timing checks need a quiet machine as well as a load
// on schedule; the Retry-After count is judged whatever the machine did.
func TestSheddingBusyMachineIsNotJudged(t *testing.T) {
	p := shedParams{slots: 5, service: 50 * time.Millisecond, rps: 300, duration: time.Second, timeout: 600 * time.Millisecond, limit: 20}
	rows := []shedRow{{label: "no shedding"}, {label: "shed at 20"}, {label: "adaptive limit"}}
	mix := []mixShare{{p: 0, weight: 1}}
	// Bad numbers: timeouts and slow answers everywhere, as a stalled
	// machine produces, but every 503 with its Retry-After.
	res := func(late lateness) shedResult {
		r := shedResult{sendRate: 300, lagP99: time.Millisecond, late: late}
		for i := range 300 {
			o := shot{sched: time.Duration(i) * time.Second / 300, took: 590 * time.Millisecond, code: 200}
			switch i % 3 {
			case 0:
				o.code, o.late, o.took = 0, true, 600*time.Millisecond
			case 1:
				o.code, o.ra, o.took = 503, true, 40*time.Millisecond
			}
			r.shots = append(r.shots, o)
		}
		return r
	}
	r := &Result{}
	p.checks(r, rows, []shedResult{res(busyLate), res(busyLate), res(busyLate)}, mix)
	mustNotFail(t, r)
	var judged []string
	for _, c := range r.Checks {
		if c.Verdict != NotJudged {
			judged = append(judged, c.Name)
		}
	}
	if len(judged) != 1 || judged[0] != "503s carry Retry-After" {
		t.Errorf("judged %v on a busy machine, want only the Retry-After count", judged)
	}
	quiet := &Result{}
	p.checks(quiet, rows, []shedResult{res(quietLate), res(quietLate), res(quietLate)}, mix)
	if len(quiet.NotJudged()) > 0 || len(quiet.Failed()) == 0 {
		t.Errorf("quiet machine: %v; want the same numbers judged, and failed", quiet.Checks)
	}
}

// The hedging check once passed "p99 1.1x lower" on a machine too busy
// for 31 other checks: now the tail is not judged there, while the count
// under overload is.
func TestHedgingBusyMachineIsNotJudged(t *testing.T) {
	p := hedgingParams{fast: 10 * time.Millisecond}
	rows := func(late lateness) []hedgingRow {
		return []hedgingRow{
			{p50: 11 * time.Millisecond, p99: 110 * time.Millisecond, calls: 1000, requests: 1000, late: late},
			{hedging: true, p50: 11 * time.Millisecond, p99: 100 * time.Millisecond, calls: 1000, requests: 1150, extraPct: 15, late: late},
			{overloaded: true, calls: 1000, requests: 1000, late: late},
			{hedging: true, overloaded: true, calls: 1000, requests: 1005, extraPct: 0.5, late: late},
		}
	}
	r := &Result{}
	p.checks(r, rows(busyLate))
	if n := mustNotFail(t, r); n != 2 {
		t.Errorf("%d not judged, want the tail and the extra requests: %v", n, r.Checks)
	}
	if c := r.Checks[2]; c.Verdict != Pass {
		t.Errorf("%s: %v, want the overload's count judged", c.Name, c.Verdict)
	}
	quiet := &Result{}
	p.checks(quiet, rows(quietLate))
	if len(quiet.Failed()) != 2 {
		t.Errorf("quiet machine: %v, want the tail and the extra requests failed", quiet.Checks)
	}
}

func TestThrottlingBusyMachineIsNotJudged(t *testing.T) {
	p := throttlingParams{offered: 400, capacity: 100, phase: 2 * time.Second, settle: 500 * time.Millisecond}
	run := func(mode string, s schedule, late lateness) throttleRun {
		s.run, s.want, s.maxLag = mode, 400, throttleMaxLag
		// 300 % of the halved capacity, and opens: bad numbers.
		return throttleRun{phases: [2]phaseCount{{requests: 200}, {requests: 225, opens: 3}}, sched: s, late: late}
	}
	onTime := schedule{rate: 400, lagP99: time.Millisecond}
	for _, tc := range []struct {
		name string
		s    schedule
		late lateness
		why  string
	}{
		{"busy", onTime, busyLate, "timer lateness"},
		{"behind", schedule{rate: 200, lagP99: 300 * time.Millisecond}, quietLate, "send rate 200.0 rps of 400"},
	} {
		r := &Result{}
		p.checks(r, []throttleRun{run("none", tc.s, tc.late), run("breaker", tc.s, tc.late), run("throttling", tc.s, tc.late)})
		if n := mustNotFail(t, r); n != 2 {
			t.Errorf("%s: %d not judged, want 2: %v", tc.name, n, r.Checks)
		}
		for _, c := range r.NotJudged() {
			if !strings.Contains(c.Detail, tc.why) {
				t.Errorf("%s: %s: %q lacks %q", tc.name, c.Name, c.Detail, tc.why)
			}
		}
	}
	quiet := &Result{}
	p.checks(quiet, []throttleRun{run("none", onTime, quietLate), run("breaker", onTime, quietLate), run("throttling", onTime, quietLate)})
	if len(quiet.Failed()) != 2 {
		t.Errorf("quiet machine: %v, want both failed", quiet.Checks)
	}
}

// A guarded run whose load kept its schedule on a machine too busy to time
// it (the incident once failed "recovery none" at load average 10) is not
// judged on its recovery; the retry budget's count is.
func TestIncidentBusyButOnScheduleIsNotJudged(t *testing.T) {
	p := incParams{rps: 300, workers: 10, service: 20 * time.Millisecond, userDeadline: time.Second, recoverFrac: 0.9,
		holdFor: time.Second, recoveryTarget: time.Second, budgetRatio: 0.1, reliefFor: time.Second}
	row := incRow{variant: "refuse", outage: time.Second, guarded: true, res: synthRun(append(fill(5, 30), fill(25, 0)...)...)}
	row.res.dbIn = fill(30, 0)
	row.res.rateWanted, row.res.sendRate, row.res.lagP99 = 300, 300, time.Millisecond
	for _, tc := range []struct {
		late      lateness
		notJudged int
	}{{busyLate, 2}, {quietLate, 0}} {
		row.res.late = tc.late
		p.judge(&row)
		r := &Result{}
		p.checks(r, []incRow{row}, nil, nil)
		if got := len(r.NotJudged()); got != tc.notJudged {
			t.Errorf("lateness %v: %d not judged, want %d: %v", tc.late, got, tc.notJudged, r.Checks)
		}
		if tc.notJudged > 0 {
			mustNotFail(t, r)
			for _, c := range r.NotJudged() {
				if !strings.Contains(c.Detail, "timer lateness p99 65ms") {
					t.Errorf("%s: %q does not say which precondition failed", c.Name, c.Detail)
				}
			}
		} else if f := r.Failed(); len(f) != 1 || !strings.Contains(f[0].Name, "recovers") {
			t.Errorf("quiet machine: %v, want the recovery failed", r.Checks)
		}
	}
}

// The single-request timings of deadline, breaker and retry-after: late
// on a busy machine, not judged; what a server saw, judged.
func TestSingleCallsBusyMachineIsNotJudged(t *testing.T) {
	d := deadlineParams{slo: 500 * time.Millisecond, a: 100 * time.Millisecond, perBC: 200 * time.Millisecond, budget: 400 * time.Millisecond}
	r := &Result{}
	d.partialChecks(r, busyLate, 900*time.Millisecond, true, 200, true)
	if n := mustNotFail(t, r); n != 2 || r.Checks[2].Verdict != Pass {
		t.Errorf("deadline: %v, want the two timings not judged, C's abort judged", r.Checks)
	}
	r = &Result{}
	d.partialChecks(r, quietLate, 900*time.Millisecond, true, 200, true)
	if len(r.Failed()) != 2 {
		t.Errorf("deadline, quiet: %v, want the two timings failed", r.Checks)
	}

	b := breakerParams{attemptTimeout: 200 * time.Millisecond, hang: 5 * time.Second}
	slow := breakerOut{stale: 1, answered: 800 * time.Millisecond}
	r = &Result{}
	b.hangCheck(r, slow, busyLate)
	if mustNotFail(t, r) != 1 {
		t.Errorf("breaker: %v, want not judged", r.Checks)
	}
	r = &Result{}
	b.hangCheck(r, breakerOut{stale: 0, answered: 800 * time.Millisecond}, busyLate)
	if len(r.Failed()) != 1 {
		t.Errorf("breaker, no stale answer: %v, want failed whatever the machine", r.Checks)
	}
	r = &Result{}
	b.hangCheck(r, slow, quietLate)
	if len(r.Failed()) != 1 {
		t.Errorf("breaker, quiet: %v, want failed", r.Checks)
	}

	ra := retryAfterParams{clients: 5, status: 503}
	r = &Result{}
	ra.checks(r, raRow{honour: true, late: busyLate, retries: 5, ok: 3, afterDeadline: 1})
	if n := mustNotFail(t, r); n != 2 || r.Checks[0].Verdict != Pass {
		t.Errorf("retry-after: %v, want the count judged, success in time and after the deadline not judged", r.Checks)
	}
	r = &Result{}
	ra.checks(r, raRow{late: busyLate, retries: 2, refusedAtOnce: 3, slowest: time.Second})
	if len(r.Failed()) != 1 || r.Checks[0].Verdict != Fail {
		t.Errorf("retry-after, retried past the deadline: %v, want the count failed whatever the machine", r.Checks)
	}
	r = &Result{}
	ra.checks(r, raRow{honour: true, late: quietLate, retries: 5, ok: 3, afterDeadline: 1})
	if len(r.Failed()) != 2 {
		t.Errorf("retry-after, quiet: %v, want both timings failed", r.Checks)
	}
}
