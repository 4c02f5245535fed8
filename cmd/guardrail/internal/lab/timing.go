package lab

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The one rule for the checks that depend on time (latency percentiles,
// recovery and convergence times, goodput under a deadline): each states
// the preconditions it needs, measured during the very run it judges, and
// is reported as not judged, with the precondition that failed and its
// number, when one did not hold. The bounds themselves are the same
// whatever the machine did. Checks on counts (calls a server saw,
// attempts) need no precondition and are judged always.
//
// Two preconditions exist:
//
//   - the load generator kept its schedule: an achieved send rate of at
//     least 95 % of the scheduled one, and a p99 start lag under a bound
//     the experiment chooses (a stall it can absorb);
//   - the machine was quiet enough to time: a probe that asks for a short
//     timer over and over, alongside the measurement, saw a scheduling
//     lateness (time-weighted p99, see weightedP99) of at most quietBound,
//     and, where the kernel reports CPU pressure (Linux), tasks waited for
//     a CPU during at most maxCPUWait of the run. The timer catches the
//     stalls; the pressure catches a machine whose every core is taken,
//     where a sleeper is woken promptly but the work it starts is not.

// minSendRate is the share of its scheduled rate a load generator must
// achieve for its run to count as measured.
const minSendRate = 0.95

// schedule is how a load generator kept its schedule during a run.
type schedule struct {
	run    string        // which run, for the reason
	rate   float64       // achieved sends per second
	want   float64       // scheduled sends per second
	lagP99 time.Duration // how late requests started, at the 99th percentile
	maxLag time.Duration // the most lagP99 may be
}

// kept reports whether the load generator kept its schedule.
func (s schedule) kept() bool {
	return s.rate >= minSendRate*s.want && s.lagP99 <= s.maxLag
}

// reason says how it fell behind, with its numbers.
func (s schedule) reason() string {
	var why []string
	if s.rate < minSendRate*s.want {
		why = append(why, fmt.Sprintf("send rate %.1f rps of %.0f (want >= %.0f%%)", s.rate, s.want, 100*minSendRate))
	}
	if s.lagP99 > s.maxLag {
		why = append(why, fmt.Sprintf("p99 start lag %v (want <= %v)", s.lagP99.Round(100*time.Microsecond), s.maxLag))
	}
	run := ""
	if s.run != "" {
		run = " (" + s.run + ")"
	}
	return "the load generator fell behind its schedule" + run + ": " + strings.Join(why, ", ")
}

// quietBound is the most scheduling lateness (time-weighted p99 of the
// probe) a machine may show and still count as quiet enough to time. A
// quiet 2-core machine running the lab shows a few milliseconds at most;
// one with every core busy shows tens.
const quietBound = 10 * time.Millisecond

// maxCPUWait is the largest share of a run during which some task may
// wait for a CPU (the kernel's CPU pressure, "some") on a machine quiet
// enough to time. The lab's own load on 2 cores stays below it; with 8
// busy loops it is over 90 % of the time.
const maxCPUWait = 0.5

// cpuPressureFile is where Linux reports CPU pressure.
const cpuPressureFile = "/proc/pressure/cpu"

// cpuStall returns the total time some task has waited for a CPU since
// boot, or false where the kernel does not say.
func cpuStall() (time.Duration, bool) {
	b, err := os.ReadFile(cpuPressureFile)
	if err != nil {
		return 0, false
	}
	return parseCPUPressure(string(b))
}

// parseCPUPressure reads the "some" line's total (microseconds) of a
// pressure file: "some avg10=0.00 avg60=0.00 avg300=0.00 total=12345".
func parseCPUPressure(s string) (time.Duration, bool) {
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "some" {
			continue
		}
		for _, kv := range f[1:] {
			if v, ok := strings.CutPrefix(kv, "total="); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				if err != nil || us < 0 || us > math.MaxInt64/int64(time.Microsecond) {
					return 0, false
				}
				return time.Duration(us) * time.Microsecond, true
			}
		}
	}
	return 0, false
}

// probeTick is the timer the probe asks for, over and over.
const probeTick = time.Millisecond

// lateness is what a quiet probe saw.
type lateness struct {
	samples int
	p99     time.Duration // time-weighted, see weightedP99
	max     time.Duration
	// cpuWait is the share of the run during which some task waited for
	// a CPU; negative where the kernel does not say.
	cpuWait float64
}

// quiet reports whether the machine was quiet enough to time.
func (l lateness) quiet() bool {
	return l.samples > 0 && l.p99 <= quietBound && l.cpuWait <= maxCPUWait
}

// reason says how busy the machine was, with its numbers.
func (l lateness) reason(run string) string {
	if run != "" {
		run = " (" + run + ")"
	}
	if l.samples == 0 {
		return "the machine was not shown quiet enough to time" + run + ": its probe took no sample"
	}
	var why []string
	if l.p99 > quietBound {
		why = append(why, fmt.Sprintf("timer lateness p99 %v, at most %v over %d samples (want p99 <= %v)",
			l.p99.Round(10*time.Microsecond), l.max.Round(10*time.Microsecond), l.samples, quietBound))
	}
	if l.cpuWait > maxCPUWait {
		why = append(why, fmt.Sprintf("tasks waited for a CPU %.0f%% of the time (want <= %.0f%%)", 100*l.cpuWait, 100*maxCPUWait))
	}
	return "the machine was too busy to time" + run + ": " + strings.Join(why, ", ")
}

func (l lateness) String() string {
	s := fmt.Sprintf("p99 %v, max %v", l.p99.Round(10*time.Microsecond), l.max.Round(10*time.Microsecond))
	if l.cpuWait >= 0 {
		s += fmt.Sprintf(", CPU wait %.0f%%", 100*l.cpuWait)
	}
	return s
}

// worse returns the lateness of two runs judged together: the worse p99.
func (l lateness) worse(o lateness) lateness {
	if o.samples == 0 {
		return l
	}
	if l.samples == 0 {
		return o
	}
	return lateness{samples: min(l.samples, o.samples), p99: max(l.p99, o.p99), max: max(l.max, o.max), cpuWait: max(l.cpuWait, o.cpuWait)}
}

// weightedP99 returns the lateness that an instant picked at random in
// the probe's run meets at the 99th percentile: each sample covers the
// tick it asked for plus its lateness, so one stall of 100 ms weighs as
// much as the hundred ticks it swallowed, as it does for the requests in
// flight then.
func weightedP99(late []time.Duration, tick time.Duration) time.Duration {
	if len(late) == 0 {
		return 0
	}
	s := slices.Clone(late)
	slices.Sort(s)
	var total time.Duration
	for _, d := range s {
		total += tick + d
	}
	budget := total / 100
	var covered time.Duration
	for i := len(s) - 1; i >= 0; i-- {
		covered += tick + s[i]
		if covered > budget {
			return s[i]
		}
	}
	return s[0]
}

// quietProbe measures scheduling lateness, and CPU pressure where the
// kernel reports it, while a run goes on: start it with probeQuiet, read
// it with stop or before.
type quietProbe struct {
	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan struct{}
	late     []time.Duration
	at       []time.Time // when each sample ended
	stalls   []stallMark // CPU pressure, now and then; empty where unknown
	res      lateness
}

// stallMark is the kernel's CPU stall total read at a time.
type stallMark struct {
	at    time.Time
	stall time.Duration
}

// stallEvery is how many timer samples the probe takes between two reads
// of the CPU pressure.
const stallEvery = 100

// probeQuiet starts a probe that sleeps probeTick over and over and records
// how late each sleep ended, until stop. It costs the run a wake-up a
// millisecond, and a small file read every stallEvery of them.
func probeQuiet(ctx context.Context) *quietProbe {
	ctx, cancel := context.WithCancel(ctx)
	q := &quietProbe{cancel: cancel, done: make(chan struct{})}
	mark := func() {
		if st, ok := cpuStall(); ok && (len(q.stalls) > 0 || len(q.late) == 0) {
			q.stalls = append(q.stalls, stallMark{time.Now(), st})
		}
	}
	mark()
	go func() {
		defer close(q.done)
		for ctx.Err() == nil {
			t0 := time.Now()
			time.Sleep(probeTick)
			now := time.Now()
			q.late = append(q.late, max(0, now.Sub(t0)-probeTick))
			q.at = append(q.at, now)
			if len(q.late)%stallEvery == 0 {
				mark()
			}
		}
		mark()
	}()
	return q
}

// stop ends the probe and returns what it saw; later calls return the same.
func (q *quietProbe) stop() lateness {
	q.stopOnce.Do(func() {
		q.cancel()
		<-q.done
		q.res = measureLateness(q.late, probeTick)
		q.res.cpuWait = cpuWait(q.stalls, time.Time{})
	})
	return q.res
}

// before stops the probe and returns what it saw until t: the part of a
// run that is judged.
func (q *quietProbe) before(t time.Time) lateness {
	q.stop()
	n := 0
	for n < len(q.at) && q.at[n].Before(t) {
		n++
	}
	l := measureLateness(q.late[:n], probeTick)
	l.cpuWait = cpuWait(q.stalls, t)
	return l
}

// cpuWait is the share of the time between the first mark and the last
// one before t (any, when t is zero) during which some task waited for a
// CPU, or -1 when fewer than two marks span it.
func cpuWait(marks []stallMark, t time.Time) float64 {
	n := len(marks)
	if !t.IsZero() {
		n = 0
		for n < len(marks) && !marks[n].at.After(t) {
			n++
		}
	}
	if n < 2 {
		return -1
	}
	first, last := marks[0], marks[n-1]
	wall := last.at.Sub(first.at)
	if wall <= 0 || last.stall < first.stall {
		return -1
	}
	return min(1, float64(last.stall-first.stall)/float64(wall))
}

// measureLateness summarises a probe's samples.
func measureLateness(late []time.Duration, tick time.Duration) lateness {
	if len(late) == 0 {
		return lateness{cpuWait: -1}
	}
	return lateness{samples: len(late), p99: weightedP99(late, tick), max: slices.Max(late), cpuWait: -1}
}

// timing collects the preconditions of a timing-dependent check.
type timing struct {
	failed []string
}

// needSchedule requires the load generator to have kept its schedule.
func (t *timing) needSchedule(s schedule) *timing {
	if !s.kept() {
		t.failed = append(t.failed, s.reason())
	}
	return t
}

// needQuiet requires the machine to have been quiet during the run.
func (t *timing) needQuiet(run string, l lateness) *timing {
	if !l.quiet() {
		t.failed = append(t.failed, l.reason(run))
	}
	return t
}

// held reports whether every precondition held.
func (t *timing) held() bool { return len(t.failed) == 0 }

// reason says which preconditions failed, with their numbers.
func (t *timing) reason() string { return strings.Join(t.failed, "; ") }

// timed records a timing-dependent check: judged as check does when every
// precondition of t held, else not judged with the ones that failed.
func (r *Result) timed(t *timing, ok bool, name string, detailFormat string, args ...any) {
	if !t.held() {
		r.notJudged(name, "%s", t.reason())
		return
	}
	r.check(ok, name, detailFormat, args...)
}
