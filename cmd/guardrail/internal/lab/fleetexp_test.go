package lab

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// fleetRows returns the fleet experiment's rows by label.
func fleetRows(t *testing.T, res *Result) map[string]Row {
	t.Helper()
	rows := map[string]Row{}
	for _, r := range res.Rows {
		rows[r.Label] = r
	}
	for _, label := range []string{"limiter: fleet.Limiter on redisfleet", "semaphore: fleet.Semaphore on redissem", "hints: none", "hints: fleet.Hints on redisbus"} {
		if _, ok := rows[label]; !ok {
			t.Fatalf("no row %q; rows: %v", label, res.Rows)
		}
	}
	return rows
}

// The experiment starts real processes (this test binary, which TestMain
// turns into a worker) against a real Redis: the limiter holds the fleet
// to its limit with few round trips, the semaphore's server never sees
// more than the limit, and hints on Redis keep the fleet away during the
// pause where, without them, its traffic goes on.
func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 32 processes for about 5 s")
	}
	addr := os.Getenv("GUARDRAIL_TEST_REDIS_ADDR")
	if addr == "" {
		t.Skip("set GUARDRAIL_TEST_REDIS_ADDR to a Redis (host:port) to run the fleet experiment's processes against it")
	}
	res := runExpTries(t, 2, "fleet", "--redis", addr)
	rows := fleetRows(t, res)

	lim := rows["limiter: fleet.Limiter on redisfleet"]
	if got := col(t, lim, "processes").(int); got != 8 {
		t.Errorf("limiter: %d processes of their own reported, want 8", got)
	}
	// Unshared, 8 processes would admit the whole 3000 offered; the bounds
	// are wide because other test packages share the machine (the checks
	// hold the experiment to its targets when it is quiet).
	if got := col(t, lim, "admitted_rps").(float64); got < 800 || got > 1200 {
		t.Errorf("limiter: admitted %.1f/s, want about the limit of 1000", got)
	}
	if got := col(t, lim, "redis_round_trips_per_request").(float64); got <= 0 || got > 0.5 {
		t.Errorf("limiter: %.3f round trips per admitted request, want some, far fewer than one", got)
	}
	if got := col(t, lim, "offered_rps").(float64); got < 1500 {
		t.Errorf("limiter: offered %.0f/s, want about 3000", got)
	}

	sem := rows["semaphore: fleet.Semaphore on redissem"]
	if got := col(t, sem, "processes").(int); got != 8 {
		t.Errorf("semaphore: %d processes reported, want 8", got)
	}
	if top, calls := col(t, sem, "max_in_flight").(int), col(t, sem, "calls").(int); top < 1 || top > 16 || calls == 0 {
		t.Errorf("semaphore: at most %d in flight over %d calls, want 1 to the limit of 16", top, calls)
	}

	off, on := rows["hints: none"], rows["hints: fleet.Hints on redisbus"]
	for _, r := range []Row{off, on} {
		if got := col(t, r, "processes").(int); got != 8 {
			t.Errorf("%s: %d processes reported, want 8", r.Label, got)
		}
	}
	// Without hints every process keeps calling, 20 times a second.
	if got := col(t, off, "calls_during_pause").(int); got < 4*8 {
		t.Errorf("without hints: %d calls during the pause, want the fleet's traffic", got)
	}
	if got := col(t, on, "calls_during_pause").(int); got > 2*8 {
		t.Errorf("with hints: %d calls during the pause, want about one per process at most", got)
	}
	if got, ok := col(t, on, "resume_ms").(time.Duration); !ok || got > 2*time.Second {
		t.Errorf("with hints: resumed after %v, want within the run", col(t, on, "resume_ms"))
	}
	if got := col(t, on, "refused_locally").(int); got == 0 {
		t.Error("with hints: no call was refused locally")
	}
}

// Without a Redis, the experiment starts nothing and judges nothing, and
// says why; the lab's exit status is left alone.
func TestFleetWithoutRedis(t *testing.T) {
	down, err := closedPort()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, addr, want string
	}{
		{"no address", "", "no Redis: set --redis or GUARDRAIL_LAB_REDIS_ADDR"},
		{"unreachable", down, "no Redis at " + down},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			res := runExp(t, "fleet", "--redis", tc.addr)
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %v to give up, want quickly", took)
			}
			if len(res.Checks) != len(fleetChecks) {
				t.Errorf("%d checks, want every one of the %d", len(res.Checks), len(fleetChecks))
			}
			for _, c := range res.Checks {
				if c.Verdict != NotJudged || !strings.Contains(c.Detail, tc.want) || !strings.Contains(c.Detail, "set --redis or GUARDRAIL_LAB_REDIS_ADDR") {
					t.Errorf("%s: %v, %q; want not judged, saying %q", c.Name, c.Verdict, c.Detail, tc.want)
				}
			}
			if len(res.Rows) != 0 {
				t.Errorf("rows without a run: %v", res.Rows)
			}
		})
	}
}

// --redis defaults to GUARDRAIL_LAB_REDIS_ADDR.
func TestFleetRedisFromEnvironment(t *testing.T) {
	t.Setenv(fleetRedisEnv, "redis.example:6379")
	p, _ := bindExp(t, "fleet", true)
	if got := p.(*fleetParams).redis; got != "redis.example:6379" {
		t.Errorf("--redis defaults to %q, want the environment's", got)
	}
}

func TestFleetWindows(t *testing.T) {
	p := fleetParams{limit: 1000, offered: 3000}
	// Two seconds of 100 ms buckets: the first second admits 100 per
	// bucket with the pace held; the second admits 120 per bucket, and its
	// offered load fell to a third.
	run := limiterRun{}
	for i := range 20 {
		a, s := 100, 300
		if i >= 10 {
			a, s = 120, 100
		}
		run.admitted, run.started = append(run.admitted, a), append(run.started, s)
	}
	run.maxLag = make([]time.Duration, 20)
	ws := p.windows(run, 0, 10)
	if len(ws) != 11 {
		t.Fatalf("%d windows of 1 s in 2 s, want 11", len(ws))
	}
	if dev, n := worstWindow(ws, true); dev != 0 || n != 1 {
		t.Errorf("paced windows: worst %+.1f %% over %d, want 0 over the first only", dev, n)
	}
	if dev, n := worstWindow(ws, false); dev != 20 || n != 11 {
		t.Errorf("every window: worst %+.1f %% over %d, want +20 over 11", dev, n)
	}
	// A call that began late in the first second (a stall) shifted its
	// admission: that window's pace did not hold either.
	run.maxLag[3] = 30 * time.Millisecond
	if _, n := worstWindow(p.windows(run, 0, 10), true); n != 0 {
		t.Errorf("%d windows paced with a call 30ms late, want none", n)
	}
}

// The workers are real processes, this test binary started again (TestMain
// lets it be one): one that cannot reach its Redis ends saying why, and
// the experiment reports that at once instead of waiting for it.
func TestFleetWorkerFailureIsReported(t *testing.T) {
	down, err := closedPort()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := workerConfig{Role: roleLimiter, Redis: down, Prefix: "test:", Fleet: 2, Duration: time.Second,
		Key: "k", Limit: 10, Burst: 1, RPS: 10, Goroutines: 1}
	start := time.Now()
	_, err = runWorkers(context.Background(), exe, []workerConfig{cfg, cfg}, func(time.Time) { t.Error("prepared a run whose workers never got ready") })
	if err == nil || !strings.Contains(err.Error(), "redis at "+down) {
		t.Fatalf("runWorkers: %v; want the worker's reason, that Redis at %s is down", err, down)
	}
	if took := time.Since(start); took > workerTimeout/2 {
		t.Errorf("took %v to report a worker that ended, want at once", took)
	}
}
