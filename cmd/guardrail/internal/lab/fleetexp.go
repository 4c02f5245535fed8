package lab

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// fleetRedisEnv is where the fleet experiment's --redis defaults from.
const fleetRedisEnv = "GUARDRAIL_LAB_REDIS_ADDR"

// fleetParams are the fleet experiment's flags.
type fleetParams struct {
	redis     string
	processes int

	// the limiter
	limit      float64
	burst      int
	offered    float64
	duration   time.Duration // the limiter's run, warm-up included
	warmup     time.Duration
	goroutines int

	// the semaphore
	semLimit int
	callers  int
	work     time.Duration

	// the hints
	pause time.Duration
	every time.Duration
}

// The hints' run: a lead before the pause and an observation after it.
const (
	fleetLead  = 300 * time.Millisecond
	fleetAfter = 1200 * time.Millisecond
)

func fleetExp() Experiment {
	return bound(Experiment{
		Name:    "fleet",
		Summary: "fleet-wide limits across real OS processes on one Redis: the rate limiter, the semaphore, and hints of a dependency's pause",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := fleetParams{redis: os.Getenv(fleetRedisEnv), processes: 8,
				limit: 1000, burst: 200, offered: 3000, duration: 11 * time.Second, warmup: time.Second, goroutines: 4,
				semLimit: 16, callers: 4, work: 50 * time.Millisecond,
				pause: time.Second, every: 50 * time.Millisecond}
			if quick {
				p.duration, p.warmup = 2500*time.Millisecond, 500*time.Millisecond
			}
			fs.StringVar(&p.redis, "redis", p.redis, "the Redis address the processes share (default $"+fleetRedisEnv+"); none: every check is not judged")
			fs.IntVar(&p.processes, "processes", p.processes, "OS processes of each part (the hints run two fleets of them)")
			fs.Float64Var(&p.limit, "limit", p.limit, "the fleet-wide limit, requests a second for the one key")
			fs.IntVar(&p.burst, "burst", p.burst, "the limit's burst")
			fs.Float64Var(&p.offered, "offered", p.offered, "requests a second offered to the whole fleet; one process gets half")
			fs.DurationVar(&p.duration, "duration", p.duration, "the limiter's run, the warm-up included")
			fs.DurationVar(&p.warmup, "warmup", p.warmup, "the start of the limiter's run left out of the numbers (the bucket starts full)")
			fs.IntVar(&p.goroutines, "goroutines", p.goroutines, "goroutines per process sending the limiter's requests")
			fs.IntVar(&p.semLimit, "sem-limit", p.semLimit, "the fleet semaphore's limit: calls in flight across the fleet")
			fs.IntVar(&p.callers, "callers", p.callers, "callers per process taking the semaphore")
			fs.DurationVar(&p.work, "work", p.work, "how long the counting server takes per call under the semaphore")
			fs.DurationVar(&p.pause, "pause", p.pause, "how long the hints' dependency answers 503 with Retry-After (whole seconds)")
			fs.DurationVar(&p.every, "every", p.every, "time between two calls of one hints process")
			return &p
		},
	})
}

// Bounds of the fleet experiment's flags.
const (
	fleetMaxProcesses = 32
	fleetMaxPause     = 30 * time.Second // fleet.DefaultMaxPause: a longer pause is capped
)

func (p fleetParams) checkFlags() error {
	var c flagCheck
	within(&c, "processes", p.processes, closed(2, fleetMaxProcesses))
	within(&c, "limit", p.limit, above(0, float64(maxRPS)))
	within(&c, "burst", p.burst, closed(1, 1_000_000))
	within(&c, "offered", p.offered, closed(1, float64(maxRPS)))
	within(&c, "warmup", p.warmup, closed(0, maxRun))
	within(&c, "duration", p.duration, above(0, maxRun))
	if p.duration-p.warmup < time.Second {
		c.failf("--duration is %v and --warmup %v; want at least a second measured between them", p.duration, p.warmup)
	}
	within(&c, "goroutines", p.goroutines, closed(1, 1000))
	within(&c, "sem-limit", p.semLimit, closed(1, 10_000))
	within(&c, "callers", p.callers, closed(1, 1000))
	within(&c, "work", p.work, above(0, maxWait))
	within(&c, "pause", p.pause, closed(time.Second, fleetMaxPause))
	if p.pause%time.Second != 0 {
		c.failf("--pause is %v; want whole seconds, as Retry-After says them", p.pause)
	}
	within(&c, "every", p.every, closed(time.Millisecond, 10*time.Second))
	return c.err()
}

// The fleet experiment's checks, named once: without Redis every one is
// reported not judged.
const (
	fleetCheck10s      = "limiter: admitted within 5 % of the limit over every 10 s window"
	fleetCheck1s       = "limiter: admitted within 10 % of the limit over every 1 s window whose offered pace held"
	fleetCheckTrips    = "limiter: at most 0.1 Redis round trips per admitted request"
	fleetCheckP99      = "limiter: at most 50 µs added to p99"
	fleetCheckSem      = "semaphore: never more calls in flight than the limit, as the server counts them"
	fleetCheckPause    = "hints: about one call per process reaches the dependency during its pause"
	fleetCheckResume   = "hints: the fleet resumes within 1 s of the pause's end"
	fleetMaxDev10s     = 5.0
	fleetMaxDev1s      = 10.0
	fleetMaxTrips      = 0.1
	fleetMaxP99        = 50 * time.Microsecond
	fleetMaxResume     = time.Second
	fleetMaxLag        = 50 * time.Millisecond
	fleetNoRedisDetail = "set --redis or " + fleetRedisEnv
)

var fleetChecks = []string{fleetCheck10s, fleetCheck1s, fleetCheckTrips, fleetCheckP99, fleetCheckSem, fleetCheckPause, fleetCheckResume}

func (p fleetParams) run(ctx context.Context, env *Env) (*Result, error) {
	r := &Result{Experiment: "fleet", Title: fmt.Sprintf("%d OS processes on one Redis: a limit of %.0f/s offered %.0f/s (one process gets half), a semaphore of %d, a dependency paused %v",
		p.processes, p.limit, p.offered, p.semLimit, p.pause)}
	if p.redis == "" {
		for _, name := range fleetChecks {
			r.notJudged(name, "no Redis: %s", fleetNoRedisDetail)
		}
		r.note("the experiment needs a Redis the processes share: %s (the CI script sets it to the Redis it starts)", fleetNoRedisDetail)
		return r, nil
	}
	if err := pingRedis(ctx, p.redis); err != nil {
		for _, name := range fleetChecks {
			r.notJudged(name, "no Redis at %s (%v): %s", p.redis, err, fleetNoRedisDetail)
		}
		return r, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	// The run's own keys and channel: runs that share a Redis, at once or
	// one after the other, never meet.
	prefix := fmt.Sprintf("guardrail-lab:fleet:%d-%016x:", os.Getpid(), rand.Uint64())

	env.Progress("fleet: the limiter, %d processes", p.processes)
	lim, err := p.runLimiter(ctx, exe, prefix)
	if err != nil {
		return nil, fmt.Errorf("limiter: %w", err)
	}
	env.Progress("fleet: the semaphore and the hints, %d processes each", p.processes)
	sem, hints, late, err := p.runSemaphoreAndHints(ctx, exe, prefix)
	if err != nil {
		return nil, err
	}
	p.report(r, lim, sem, hints, late)
	return r, nil
}

// pingRedis asks Redis at addr for a PING, briefly.
func pingRedis(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 500 * time.Millisecond, ReadTimeout: 500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond, MaxRetries: -1, ContextTimeoutEnabled: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// limiterRun is what the limiter's processes counted, merged.
type limiterRun struct {
	procs              int             // processes that reported, each a process of its own
	started, admitted  []int           // per limBucket, every process
	maxLag             []time.Duration // per limBucket, the latest start of any process
	errors, roundTrips int64
	admittedAll        int // the whole run, warm-up included
	busiest            int // admitted by the process offered half
	p99                time.Duration
	sched              schedule
	late               lateness
}

// runLimiter starts the limiter's processes and merges what they counted.
func (p fleetParams) runLimiter(ctx context.Context, exe, prefix string) (limiterRun, error) {
	var run limiterRun
	cfgs := make([]workerConfig, p.processes)
	for i := range cfgs {
		rps := p.offered / 2
		if i > 0 {
			rps = p.offered / 2 / float64(p.processes-1)
		}
		cfgs[i] = workerConfig{Role: roleLimiter, Redis: p.redis, Prefix: prefix, ID: i, Fleet: p.processes, Duration: p.duration,
			Key: "tenant", Limit: p.limit, Burst: p.burst, RPS: rps, Goroutines: p.goroutines}
	}
	var probe *quietProbe
	var start time.Time
	res, err := runWorkers(ctx, exe, cfgs, func(s time.Time) { start, probe = s, probeQuiet(ctx) })
	if probe != nil {
		run.late = probe.before(start.Add(p.duration))
	}
	if err != nil {
		return run, err
	}
	n := int(p.duration / limBucket)
	run.started, run.admitted, run.maxLag = make([]int, n), make([]int, n), make([]time.Duration, n)
	var lat, lag [][][2]int64
	pids := map[int]bool{}
	for i, w := range res {
		if w.PID != os.Getpid() {
			pids[w.PID] = true
		}
		for j := range min(n, len(w.Started), len(w.Admitted), len(w.MaxLag)) {
			run.started[j] += w.Started[j]
			run.admitted[j] += w.Admitted[j]
			run.maxLag[j] = max(run.maxLag[j], time.Duration(w.MaxLag[j])*time.Microsecond)
		}
		for _, a := range w.Admitted {
			run.admittedAll += a
			if i == 0 {
				run.busiest += a
			}
		}
		run.errors += int64(w.Errors)
		run.roundTrips += w.RoundTrips
		lat, lag = append(lat, w.Latency), append(lag, w.Lag)
	}
	run.procs = len(pids)
	run.p99 = time.Duration(histQuantile(0.99, lat...)) * time.Microsecond
	from := int(p.warmup / limBucket)
	secs := float64(n-from) * limBucket.Seconds()
	run.sched = schedule{run: "limiter", rate: float64(sumInts(run.started[from:])) / secs, want: p.offered,
		lagP99: time.Duration(histQuantile(0.99, lag...)) * 100 * time.Microsecond, maxLag: fleetMaxLag}
	return run, nil
}

func sumInts(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// fleetWindow is one sliding window of the limiter's counts.
type fleetWindow struct {
	dev   float64 // admitted against the limit, %
	paced bool    // the offered pace held in it
}

// fleetWindowLag is the latest any call of a window may begin against its
// schedule for the window's pace to count as held: a call that begins L
// late is counted L later, and at the limit's rate moves L x limit
// admissions from one window into the next (20 ms: 2 % of a 1 s window).
const fleetWindowLag = 20 * time.Millisecond

// windows returns every window of width buckets from bucket from on,
// sliding by one bucket.
func (p fleetParams) windows(run limiterRun, from, width int) []fleetWindow {
	var out []fleetWindow
	want := p.limit * float64(width) * limBucket.Seconds()
	offered := p.offered * float64(width) * limBucket.Seconds()
	for i := from; i+width <= len(run.admitted); i++ {
		a, s := sumInts(run.admitted[i:i+width]), sumInts(run.started[i:i+width])
		lag := time.Duration(0)
		if len(run.maxLag) >= i+width {
			lag = slices.Max(run.maxLag[i : i+width])
		}
		out = append(out, fleetWindow{dev: (float64(a) - want) / want * 100, paced: float64(s) >= minSendRate*offered && lag <= fleetWindowLag})
	}
	return out
}

// worstWindow returns the window of the largest deviation, of those paced when
// pacedOnly, and how many windows were looked at.
func worstWindow(ws []fleetWindow, pacedOnly bool) (dev float64, n int) {
	for _, w := range ws {
		if pacedOnly && !w.paced {
			continue
		}
		n++
		if math.Abs(w.dev) > math.Abs(dev) {
			dev = w.dev
		}
	}
	return math.Round(dev*10) / 10, n
}

// semRun is what the semaphore's counting server saw.
type semRun struct {
	procs              int
	calls, maxInFlight int64 // as the server counted them
	refused, failed    int   // as the processes counted them
}

// hintsRun is what the hints' dependency saw, for one fleet.
type hintsRun struct {
	hints            bool
	procs            int
	callsDuringPause int
	resumed          int           // processes that called again after the pause
	resume           time.Duration // the slowest of them; -1 if one never did
	refused          int           // calls refused locally, paused
}

// inFlightServer counts the calls in flight at once, and the most it saw.
type inFlightServer struct {
	work          time.Duration
	cur, top, all atomic.Int64
}

func (s *inFlightServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raiseTo(&s.top, s.cur.Add(1))
	s.all.Add(1)
	time.Sleep(s.work)
	// Counted out before the answer leaves: the caller's slot is held
	// until it has read it, so the count never runs ahead of the slots.
	s.cur.Add(-1)
	_, _ = w.Write([]byte("ok"))
}

// pausingDep answers 503 with a Retry-After of the whole seconds left
// during its pause, 200 otherwise, and records every call.
type pausingDep struct {
	mu         sync.Mutex
	start, end time.Time
	calls      []depCall
}

type depCall struct {
	at   time.Time
	proc string
}

func (d *pausingDep) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	d.mu.Lock()
	d.calls = append(d.calls, depCall{now, r.Header.Get("X-Process")})
	start, end := d.start, d.end
	d.mu.Unlock()
	if !start.IsZero() && !now.Before(start) && now.Before(end) {
		secs := (end.Sub(now) + time.Second - 1) / time.Second
		w.Header().Set("Retry-After", strconv.Itoa(int(secs)))
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (d *pausingDep) setPause(start, end time.Time) {
	d.mu.Lock()
	d.start, d.end = start, end
	d.mu.Unlock()
}

// measure counts the calls during the pause and when each process first
// called after it.
func (d *pausingDep) measure(h *hintsRun) {
	d.mu.Lock()
	defer d.mu.Unlock()
	resumed := map[string]time.Duration{}
	for _, c := range d.calls {
		switch {
		case c.at.Before(d.start):
		case c.at.Before(d.end):
			h.callsDuringPause++
		default:
			if _, ok := resumed[c.proc]; !ok {
				resumed[c.proc] = c.at.Sub(d.end)
			}
		}
	}
	h.resumed = len(resumed)
	for _, r := range resumed {
		h.resume = max(h.resume, r)
	}
	if h.resumed < h.procs {
		h.resume = -1
	}
}

// runSemaphoreAndHints runs the semaphore's fleet and the two hints
// fleets (without hints, with hints on Redis) at once: their checks count
// calls at a server, a light load next to the limiter's.
func (p fleetParams) runSemaphoreAndHints(ctx context.Context, exe, prefix string) (semRun, [2]hintsRun, lateness, error) {
	var sem semRun
	var hints [2]hintsRun
	counting := &inFlightServer{work: p.work}
	cs, err := serve(counting)
	if err != nil {
		return sem, hints, lateness{}, err
	}
	defer cs.Close()
	var deps [2]*pausingDep
	length := fleetLead + p.pause + fleetAfter
	var cfgs []workerConfig
	for i := range p.processes {
		cfgs = append(cfgs, workerConfig{Role: roleSemaphore, Redis: p.redis, Prefix: prefix, ID: i, Fleet: p.processes, Duration: length,
			URL: cs.URL, SemLimit: p.semLimit, Callers: p.callers})
	}
	for k, withHints := range []bool{false, true} {
		deps[k] = new(pausingDep)
		ds, err := serve(deps[k])
		if err != nil {
			return sem, hints, lateness{}, err
		}
		defer ds.Close()
		for i := range p.processes {
			// Spread over the interval, as a fleet's calls are: processes
			// that called in step would meet the pause's first instant
			// together.
			cfgs = append(cfgs, workerConfig{Role: roleHints, Redis: p.redis, Prefix: prefix + strconv.Itoa(k) + ":", ID: i, Fleet: p.processes,
				Duration: length, URL: ds.URL, Hints: withHints, Every: p.every, Phase: p.every * time.Duration(i) / time.Duration(p.processes)})
		}
		hints[k] = hintsRun{hints: withHints}
	}
	var probe *quietProbe
	var end time.Time
	res, err := runWorkers(ctx, exe, cfgs, func(start time.Time) {
		probe = probeQuiet(ctx)
		end = start.Add(length)
		for _, d := range deps {
			d.setPause(start.Add(fleetLead), start.Add(fleetLead+p.pause))
		}
	})
	var late lateness
	if probe != nil {
		late = probe.before(end)
	}
	if err != nil {
		return sem, hints, late, fmt.Errorf("semaphore and hints: %w", err)
	}
	pids := [3]map[int]bool{{}, {}, {}}
	for i, w := range res {
		part := i / p.processes // 0 semaphore, 1 without hints, 2 with
		if w.PID != os.Getpid() {
			pids[part][w.PID] = true
		}
		if part == 0 {
			sem.refused += w.Refused
			sem.failed += w.Failed
		} else {
			hints[part-1].refused += w.Refused
		}
	}
	sem.procs = len(pids[0])
	sem.calls, sem.maxInFlight = counting.all.Load(), counting.top.Load()
	for k := range hints {
		hints[k].procs = len(pids[k+1])
		deps[k].measure(&hints[k])
	}
	return sem, hints, late, nil
}

// report writes the rows, the checks and the notes.
func (p fleetParams) report(r *Result, lim limiterRun, sem semRun, hints [2]hintsRun, late lateness) {
	from := int(p.warmup / limBucket)
	n := len(lim.admitted)
	secs := float64(n-from) * limBucket.Seconds()
	admittedRPS := float64(sumInts(lim.admitted[from:])) / secs
	startedAll := sumInts(lim.started)
	errPct := 0.0
	if startedAll > 0 {
		errPct = float64(lim.errors) / float64(startedAll) * 100
	}
	trips := float64(lim.roundTrips) / float64(max(lim.admittedAll, 1))
	w10 := min(int(10*time.Second/limBucket), n-from)
	dev10, n10 := worstWindow(p.windows(lim, from, w10), false)
	ones := p.windows(lim, from, int(time.Second/limBucket))
	dev1, paced1 := worstWindow(ones, true)
	share := float64(lim.busiest) / float64(max(lim.admittedAll, 1)) * 100

	pre := func() *timing { return (&timing{}).needSchedule(lim.sched).needQuiet("limiter", lim.late) }
	ok10 := math.Abs(dev10) <= fleetMaxDev10s
	span10 := fmt.Sprintf("%d window(s) of 10 s, sliding by %v", n10, limBucket)
	if w10 < int(10*time.Second/limBucket) {
		span10 = fmt.Sprintf("the whole measured %v (shorter than 10 s)", time.Duration(w10)*limBucket)
	}
	if dev10 < 0 && 2*paced1 < len(ones) && pre().held() {
		// Under the limit while the processes could not keep their pace
		// (a loaded machine, the race detector): leases they took are
		// spent late or not at all, which measures the machine, not the
		// limiter. Over the limit is judged whatever the pace.
		r.notJudged(fleetCheck10s, "the offered pace held in %d of the %d windows of 1 s (want half at least, each >= %.0f %% of %.0f/s begun, none more than %v late); worst deviation %+.1f %% over %s",
			paced1, len(ones), 100*minSendRate, p.offered, fleetWindowLag, dev10, span10)
	} else {
		r.timed(pre(), ok10, fleetCheck10s, "worst deviation %+.1f %% over %s, want within ±%.0f %%", dev10, span10, fleetMaxDev10s)
	}
	v10 := r.last()

	t1 := (&timing{}).needQuiet("limiter", lim.late)
	if paced1 == 0 && t1.held() {
		r.notJudged(fleetCheck1s, "the offered pace held in none of the %d windows of 1 s (want >= %.0f %% of %.0f/s begun in a window, none more than %v late; %.0f/s over the run)",
			len(ones), 100*minSendRate, p.offered, fleetWindowLag, lim.sched.rate)
	} else {
		r.timed(t1, math.Abs(dev1) <= fleetMaxDev1s, fleetCheck1s, "worst deviation %+.1f %% over %d windows of 1 s whose offered pace held (of %d), want within ±%.0f %%",
			dev1, paced1, len(ones), fleetMaxDev1s)
	}
	v1 := r.last()
	r.timed((&timing{}).needSchedule(lim.sched), trips <= fleetMaxTrips, fleetCheckTrips,
		"%.3f round trips per admitted request (%d for %d admitted), want at most %.1f", trips, lim.roundTrips, lim.admittedAll, fleetMaxTrips)
	vTrips := r.last()
	if raceEnabled {
		r.notJudged(fleetCheckP99, "built with the race detector, whose instrumentation is not a normal build's cost (p99 %v)", lim.p99)
	} else {
		r.timed(pre(), lim.p99 <= fleetMaxP99, fleetCheckP99, "p99 of Allow %v, want at most %v", lim.p99, fleetMaxP99)
	}
	vP99 := r.last()
	r.add("limiter: fleet.Limiter on redisfleet",
		Int("processes", lim.procs), Float("limit", p.limit, 0), Int("burst", p.burst).jsonOnly(),
		Float("offered_rps", math.Round(lim.sched.rate), 0), Float("admitted_rps", round(admittedRPS, 1), 1),
		Float("error_pct", round(errPct, 2), 2).jsonOnly(),
		Float("redis_round_trips_per_request", round(trips, 3), 3).Named("round_trips/request").judgedAs(vTrips),
		Float("p99_added_us", float64(lim.p99.Microseconds()), 0).Named("p99_added_µs").judgedAs(vP99),
		Float("worst_1s_dev_pct", dev1, 1).Named("worst_1s_%").judgedAs(v1),
		Float("worst_10s_dev_pct", dev10, 1).Named("worst_10s_%").judgedAs(v10),
		Float("busiest_process_share_pct", math.Round(share), 0).Named("busiest_share_%").jsonOnly(),
		Float("measured_s", secs, 1).jsonOnly())

	if sem.calls == 0 {
		r.notJudged(fleetCheckSem, "no call reached the server (%d refused, %d failed)", sem.refused, sem.failed)
	} else {
		r.check(sem.maxInFlight <= int64(p.semLimit), fleetCheckSem, "at most %d in flight at the server over %d calls from %d processes x %d callers, want at most %d",
			sem.maxInFlight, sem.calls, sem.procs, p.callers, p.semLimit)
	}
	vSem := r.last()
	length := fleetLead + p.pause + fleetAfter
	use := float64(sem.calls) * p.work.Seconds() / (float64(p.semLimit) * length.Seconds())
	r.add("semaphore: fleet.Semaphore on redissem",
		Int("processes", sem.procs), Int("limit", p.semLimit), Int("callers_per_process", p.callers).jsonOnly(),
		Int("calls", int(sem.calls)), Int("max_in_flight", int(sem.maxInFlight)).judgedAs(vSem),
		Float("slot_use", round(use, 2), 2), Int("refused", sem.refused).jsonOnly(), Int("failed", sem.failed).jsonOnly())

	quiet := (&timing{}).needQuiet("semaphore and hints", late)
	off, on := hints[0], hints[1]
	r.timed(quiet, on.callsDuringPause <= on.procs && on.procs > 0, fleetCheckPause,
		"%d call(s) during the %v pause from %d processes with hints on Redis, want at most one per process (%d without hints)",
		on.callsDuringPause, p.pause, on.procs, off.callsDuringPause)
	vPause := r.last()
	r.timed(quiet, on.resume >= 0 && on.resume <= fleetMaxResume, fleetCheckResume,
		"%d of %d processes called again, the last %s after the pause's end, want all within %v", on.resumed, on.procs, resumeText(on.resume), fleetMaxResume)
	vResume := r.last()
	for _, h := range hints {
		label := "hints: none"
		callsCol := Int("calls_during_pause", h.callsDuringPause)
		resumeCol := Ms("resume_ms", h.resume)
		if h.resume < 0 {
			resumeCol = Col{Key: "resume_ms", Value: nil} // never
		}
		if h.hints {
			label = "hints: fleet.Hints on redisbus"
			callsCol, resumeCol = callsCol.judgedAs(vPause), resumeCol.judgedAs(vResume)
		}
		r.add(label, Bool("hints", h.hints).jsonOnly(), Int("processes", h.procs), Ms("pause_ms", p.pause),
			Int("calls_per_process_per_s", int(time.Second/p.every)).jsonOnly(),
			callsCol, resumeCol, Int("processes_resumed", h.resumed).jsonOnly(), Int("refused_locally", h.refused).jsonOnly())
	}

	xs, admitted, limit := make([]float64, 0, n), make([]float64, 0, n), make([]float64, 0, n)
	for i, a := range lim.admitted {
		xs = append(xs, float64(i)*limBucket.Seconds())
		admitted = append(admitted, float64(a)/limBucket.Seconds())
		limit = append(limit, p.limit)
	}
	r.Charts = append(r.Charts, Chart{Title: "fleet limiter: admitted per second, every process together (100 ms buckets)", Kind: "line",
		XLabel: "s since the start", YLabel: "requests/s", XValues: xs,
		Series: []Series{Series{Name: "admitted", Values: admitted}.notJudgedIf(v10 != NotJudged), {Name: "limit", Values: limit}}})

	r.note("every row's processes are OS processes of this binary, started for the run (each counts its own); one Redis at %s, keys and channels under a prefix of the run's own", p.redis)
	r.note("limiter: one key, burst %d, %d goroutines per process, each Redis call bounded by %v, FailOpen with Members fleet.Fixed(%d); the first %v of %v is left out (the bucket starts full); offered_rps counts the calls begun", p.burst, p.goroutines, workerStoreTimeout, p.processes, p.warmup, p.duration)
	r.note("limiter: load generator %.0f/s of %.0f, p99 start lag %v; timer lateness alongside it %s", lim.sched.rate, p.offered, lim.sched.lagP99.Round(100*time.Microsecond), lim.late)
	r.note("go-redis/redis_rate is not a dependency of this command: bench/fleet runs it beside the fleet limiter on the same load (docs/fleet.md)")
	r.note("semaphore: FailClosed, each call %v at a server that counts the calls in flight (a call leaves its count before its answer is sent, and keeps its slot until the answer is read); slot_use = calls x work / (limit x %v)", p.work, length)
	r.note("hints: the dependency answers 503 with Retry-After for %v, %v into a run of %v; each process calls every %v, spread over the interval, through a Policy without a breaker and with MaxAttempts 3; timer lateness %s", p.pause, fleetLead, length, p.every, late)
}

// round rounds x to prec decimals, for JSON as for the tables.
func round(x float64, prec int) float64 {
	f := math.Pow10(prec)
	return math.Round(x*f) / f
}

// resumeText is a resume time, or "never" for -1.
func resumeText(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return fmtDur(d)
}

// last is the verdict of the check recorded last, for the column it
// judged.
func (r *Result) last() Verdict { return r.Checks[len(r.Checks)-1].Verdict }
