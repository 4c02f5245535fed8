package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/extra/redisstore/redisbus"
	"github.com/guardrail-go/guardrail/extra/redisstore/redisfleet"
	"github.com/guardrail-go/guardrail/extra/redisstore/redissem"
	"github.com/guardrail-go/guardrail/fleet"
)

// FleetWorkerEnv is the environment variable that makes the lab's binary
// one process of the fleet experiment's fleet instead of what it was
// built to be: its value is the worker's configuration, as JSON. The
// experiment starts its own executable (the command, or a test binary)
// with it set; the binary's main calls FleetWorker first.
const FleetWorkerEnv = "GUARDRAIL_LAB_FLEET_WORKER"

// FleetWorker runs this process as a worker of the fleet experiment when
// FleetWorkerEnv is set, and then returns the exit code for main and
// true; without it, it returns false at once and does nothing.
//
// A worker prints "ready" when it is connected, reads the start time (Unix
// nanoseconds) as a line from its standard input, runs its part until its
// duration is over, prints what it counted as one JSON line and exits. A
// closed standard input before the start ends it.
func FleetWorker() (code int, ok bool) {
	cfg, ok := os.LookupEnv(FleetWorkerEnv)
	if !ok {
		return 0, false
	}
	if err := runWorker(cfg, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lab fleet worker:", err)
		return 1, true
	}
	return 0, true
}

// The parts a worker runs.
const (
	roleLimiter   = "limiter"
	roleSemaphore = "semaphore"
	roleHints     = "hints"
)

// workerConfig is what one worker runs: its part, and that part's
// parameters.
type workerConfig struct {
	Role     string
	Redis    string
	Prefix   string // the run's own, for every key and channel
	ID       int
	Fleet    int // processes of the part, for the failure share
	Duration time.Duration

	// limiter
	Key        string
	Limit      float64
	Burst      int
	RPS        float64 // this process's share of the offered load
	Goroutines int

	// semaphore
	URL      string // the counting server, or the dependency of hints
	SemLimit int
	Callers  int

	// hints
	Hints bool
	Every time.Duration
	Phase time.Duration
}

// workerResult is what a worker counted.
type workerResult struct {
	PID int

	// limiter, by limBucket from the start
	Started    []int      // Allow calls begun
	Admitted   []int      // of them, admitted
	MaxLag     []int64    // the latest a call begun in the bucket was against its schedule, µs
	Errors     int        // neither admitted nor refused
	RoundTrips int64      // commands sent to Redis, a pipeline counted once
	Latency    [][2]int64 // Allow's time, µs: count
	Lag        [][2]int64 // how late a call began against its schedule, 100 µs: count

	// semaphore and hints
	Refused int // semaphore: Acquire refused; hints: refused locally, paused
	Failed  int // the call failed
}

// limBucket is the resolution of the limiter's counts.
const limBucket = 100 * time.Millisecond

// workerStoreTimeout bounds each call of the limiter to Redis, as the
// benchmark's does.
const workerStoreTimeout = 50 * time.Millisecond

func runWorker(cfgJSON string, stdin io.Reader, stdout io.Writer) error {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return fmt.Errorf("%s: %w", FleetWorkerEnv, err)
	}
	client := redis.NewClient(&redis.Options{
		Addr: cfg.Redis, ContextTimeoutEnabled: true,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		MaxRetries: -1,
	})
	defer client.Close()
	var rt roundTrips
	client.AddHook(&rt)

	var part func(start time.Time) (workerResult, error)
	var stop func()
	var err error
	switch cfg.Role {
	case roleLimiter:
		part, stop, err = limiterWorker(cfg, client, &rt)
	case roleSemaphore:
		part, stop, err = semaphoreWorker(cfg, client)
	case roleHints:
		part, stop, err = hintsWorker(cfg, client)
	default:
		err = fmt.Errorf("unknown part %q", cfg.Role)
	}
	if err != nil {
		return err
	}
	defer stop()
	// Connect before the start, as a server does before taking traffic.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err = client.Ping(ctx).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("redis at %s: %w", cfg.Redis, err)
	}
	if _, err := fmt.Fprintln(stdout, "ready"); err != nil {
		return err
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil {
		return fmt.Errorf("waiting for the start: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		return fmt.Errorf("start %q: %w", line, err)
	}
	start := time.Unix(0, ns)
	time.Sleep(time.Until(start))
	rt.n.Store(0)
	res, err := part(start)
	if err != nil {
		return err
	}
	res.PID = os.Getpid()
	return json.NewEncoder(stdout).Encode(res)
}

// roundTrips counts the commands a Redis client sends: its round trips.
type roundTrips struct{ n atomic.Int64 }

func (c *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// limiterWorker offers cfg.RPS requests a second, open loop, to a
// fleet.Limiter on redisfleet, from cfg.Goroutines goroutines.
func limiterWorker(cfg workerConfig, client *redis.Client, rt *roundTrips) (func(time.Time) (workerResult, error), func(), error) {
	store, err := redisfleet.New(client, redisfleet.Config{Prefix: cfg.Prefix + "limit:"})
	if err != nil {
		return nil, nil, err
	}
	l, err := fleet.NewLimiter(fleet.LimiterConfig{
		Store: store, Rate: cfg.Limit, Burst: cfg.Burst,
		StoreTimeout: workerStoreTimeout, Members: fleet.Fixed(cfg.Fleet),
	})
	if err != nil {
		return nil, nil, err
	}
	run := func(start time.Time) (workerResult, error) {
		n := int(cfg.Duration / limBucket)
		started, admitted, maxLag := make([]atomic.Int64, n), make([]atomic.Int64, n), make([]atomic.Int64, n)
		var errs atomic.Int64
		lat := make([]map[int64]int64, cfg.Goroutines)
		lag := make([]map[int64]int64, cfg.Goroutines)
		work := make(chan int64, 1<<16) // when each call is due, Unix ns
		var wg sync.WaitGroup
		for g := range cfg.Goroutines {
			lat[g], lag[g] = map[int64]int64{}, map[int64]int64{}
			wg.Go(func() {
				for due := range work {
					t0 := time.Now()
					err := l.Allow(context.Background(), cfg.Key)
					lat[g][time.Since(t0).Microseconds()]++
					late := time.Duration(max(0, t0.UnixNano()-due))
					lag[g][int64(late/(100*time.Microsecond))]++
					i := int(t0.Sub(start) / limBucket)
					if i < 0 || i >= n {
						continue
					}
					started[i].Add(1)
					raiseTo(&maxLag[i], late.Microseconds())
					switch {
					case err == nil:
						admitted[i].Add(1)
					case !errors.Is(err, fleet.ErrLimited):
						errs.Add(1)
					}
				}
			})
		}
		// One wake-up a millisecond queues every call due by then.
		gap := float64(time.Second) / cfg.RPS
		for sent := 0; ; {
			el := time.Since(start)
			if el >= cfg.Duration {
				break
			}
			for due := int(el.Seconds() * cfg.RPS); sent < due; sent++ {
				work <- start.UnixNano() + int64(float64(sent)*gap)
			}
			time.Sleep(time.Millisecond)
		}
		close(work)
		wg.Wait()
		res := workerResult{Errors: int(errs.Load()), RoundTrips: rt.n.Load(),
			Latency: mergeHist(lat), Lag: mergeHist(lag)}
		for i := range n {
			res.Started = append(res.Started, int(started[i].Load()))
			res.Admitted = append(res.Admitted, int(admitted[i].Load()))
			res.MaxLag = append(res.MaxLag, maxLag[i].Load())
		}
		return res, nil
	}
	return run, func() { _ = l.Close() }, nil
}

// raiseTo makes v at least n.
func raiseTo(v *atomic.Int64, n int64) {
	for {
		old := v.Load()
		if n <= old || v.CompareAndSwap(old, n) {
			return
		}
	}
}

// mergeHist adds histograms into one, as pairs sorted by value.
func mergeHist(hs []map[int64]int64) [][2]int64 {
	all := map[int64]int64{}
	for _, h := range hs {
		for k, v := range h {
			all[k] += v
		}
	}
	out := make([][2]int64, 0, len(all))
	for k, v := range all {
		out = append(out, [2]int64{k, v})
	}
	slices.SortFunc(out, func(a, b [2]int64) int { return int(a[0] - b[0]) })
	return out
}

// histQuantile is the q-quantile of histograms of pairs of value and count.
func histQuantile(q float64, hists ...[][2]int64) int64 {
	all := map[int64]int64{}
	var total int64
	for _, h := range hists {
		for _, p := range h {
			all[p[0]] += p[1]
			total += p[1]
		}
	}
	keys := slices.Sorted(func(yield func(int64) bool) {
		for k := range all {
			if !yield(k) {
				return
			}
		}
	})
	need := int64(math.Ceil(q * float64(total)))
	var seen int64
	for _, k := range keys {
		if seen += all[k]; seen >= need {
			return k
		}
	}
	return 0
}

// semaphoreWorker runs cfg.Callers callers that each, over and over,
// take a slot of a fleet.Semaphore on redissem, call the counting server
// and give the slot back.
func semaphoreWorker(cfg workerConfig, client *redis.Client) (func(time.Time) (workerResult, error), func(), error) {
	store, err := redissem.New(client, redissem.Config{Prefix: cfg.Prefix + "sem:"})
	if err != nil {
		return nil, nil, err
	}
	sem, err := fleet.NewSemaphore(fleet.SemaphoreConfig{
		Store: store, Name: "lab", Limit: cfg.SemLimit, MaxWait: -1,
		// Refuse rather than run a call the shared count does not hold:
		// the check is on that count.
		OnStoreFailure: fleet.FailClosed, Members: fleet.Fixed(cfg.Fleet),
		ID: "worker-" + strconv.Itoa(cfg.ID),
	})
	if err != nil {
		return nil, nil, err
	}
	httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Callers}}
	run := func(start time.Time) (workerResult, error) {
		ctx, cancel := context.WithDeadline(context.Background(), start.Add(cfg.Duration))
		defer cancel()
		var refused, failed atomic.Int64
		var wg sync.WaitGroup
		for range cfg.Callers {
			wg.Go(func() {
				for ctx.Err() == nil {
					release, err := sem.Acquire(ctx)
					switch {
					case ctx.Err() != nil:
						if err == nil {
							release()
						}
						return
					case err != nil:
						refused.Add(1)
						time.Sleep(5 * time.Millisecond) // a store that fails refuses at once
						continue
					}
					// The call outlives the run's end rather than be cut
					// while the server counts it.
					cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err = get(cctx, httpc, cfg.URL)
					ccancel()
					release()
					if err != nil {
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return workerResult{Refused: int(refused.Load()), Failed: int(failed.Load())}, nil
	}
	return run, func() { _ = sem.Close(); httpc.CloseIdleConnections() }, nil
}

// errUnavailable is a 503 of the hints' dependency.
var errUnavailable = errors.New("503 Service Unavailable")

// hintsWorker calls the dependency every cfg.Every, each call on a
// goroutine of its own as a server's requests are, through a guardrail
// Policy without a breaker (the numbers are about Retry-After alone),
// with fleet hints on Redis when cfg.Hints.
func hintsWorker(cfg workerConfig, client *redis.Client) (func(time.Time) (workerResult, error), func(), error) {
	p := &guardrail.Policy{Name: "dep", Idempotent: true, Breaker: disabledBreaker()}
	stops := []func(){}
	if cfg.Hints {
		bus, err := redisbus.New(redisbus.Config{Client: client, Channel: cfg.Prefix + "hints"})
		if err != nil {
			return nil, nil, err
		}
		h, err := fleet.NewHints(fleet.HintsConfig{Bus: bus, Dependencies: []string{"dep"}})
		if err != nil {
			return nil, nil, err
		}
		stops = append(stops, func() { _ = h.Close() })
		select {
		case <-h.Subscribed():
		case <-time.After(5 * time.Second):
			_ = h.Close()
			return nil, nil, errors.New("hints: not subscribed after 5 s")
		}
		p.Pauses = h
	}
	httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}}
	stops = append(stops, httpc.CloseIdleConnections)
	id := strconv.Itoa(cfg.ID)
	call := func(ctx context.Context) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.URL, nil)
		if err != nil {
			return 0, guardrail.Permanent(err)
		}
		req.Header.Set("X-Process", id)
		resp, err := httpc.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			if d, ok := backoff.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
				return 0, guardrail.RetryAfterError(errUnavailable, d)
			}
			return 0, guardrail.Transient(errUnavailable)
		}
		return resp.StatusCode, nil
	}
	run := func(start time.Time) (workerResult, error) {
		var paused, failed atomic.Int64
		var wg sync.WaitGroup
		end := start.Add(cfg.Duration)
		for at := start.Add(cfg.Phase); at.Before(end); at = at.Add(cfg.Every) {
			time.Sleep(time.Until(at))
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err := guardrail.Do(ctx, p, call)
				switch {
				case err == nil:
				case errors.Is(err, guardrail.ErrPaused):
					paused.Add(1)
				default:
					failed.Add(1)
				}
			})
		}
		wg.Wait()
		return workerResult{Refused: int(paused.Load()), Failed: int(failed.Load())}, nil
	}
	return run, func() {
		for _, s := range stops {
			s()
		}
	}, nil
}

// fleetProc is one worker process, seen from the experiment.
type fleetProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr bytes.Buffer // read only after Wait
}

// workerTimeout is how long a worker may take to say it is ready, or,
// past its duration, to report.
const workerTimeout = 15 * time.Second

// runWorkers starts a process of exe for each configuration, waits until
// every one is ready, calls prepare with the start they are given (a
// moment later, so that they all begin together), and returns what each
// reported, in order.
func runWorkers(ctx context.Context, exe string, cfgs []workerConfig, prepare func(start time.Time)) ([]workerResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	procs := make([]*fleetProc, 0, len(cfgs))
	defer func() {
		cancel() // kills what is still running
		for _, p := range procs {
			_ = p.cmd.Wait()
		}
	}()
	for _, cfg := range cfgs {
		js, err := json.Marshal(cfg)
		if err != nil {
			return nil, err
		}
		p := &fleetProc{cmd: exec.CommandContext(ctx, exe)}
		p.cmd.Env = append(os.Environ(), FleetWorkerEnv+"="+string(js))
		p.cmd.Stderr = &p.stderr
		p.cmd.WaitDelay = time.Second
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			return nil, err
		}
		out, err := p.cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		p.stdout = bufio.NewReader(out)
		if err := p.cmd.Start(); err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	if _, err := readLines(cancel, procs, workerTimeout); err != nil {
		return nil, fmt.Errorf("starting the workers: %w", err)
	}
	start := time.Now().Add(50 * time.Millisecond)
	if prepare != nil {
		prepare(start)
	}
	for _, p := range procs {
		if _, err := fmt.Fprintln(p.stdin, start.UnixNano()); err != nil {
			return nil, err
		}
	}
	var longest time.Duration
	for _, c := range cfgs {
		longest = max(longest, c.Duration)
	}
	lines, err := readLines(cancel, procs, time.Until(start)+longest+workerTimeout)
	if err != nil {
		return nil, err
	}
	out := make([]workerResult, len(procs))
	for i, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			return nil, fmt.Errorf("worker %d: %v: %s", i, err, strings.TrimSpace(p.stderr.String()))
		}
		if err := json.Unmarshal([]byte(lines[i]), &out[i]); err != nil {
			return nil, fmt.Errorf("worker %d: %q: %w", i, lines[i], err)
		}
	}
	procs = nil // waited for
	return out, nil
}

// readLines reads one line from each process, at once, within timeout;
// when one fails or the time is up, it kills them all (cancel) and
// returns the error with what the process said on stderr.
func readLines(cancel context.CancelFunc, procs []*fleetProc, timeout time.Duration) ([]string, error) {
	type line struct {
		i   int
		s   string
		err error
	}
	ch := make(chan line, len(procs))
	for i, p := range procs {
		go func() {
			s, err := p.stdout.ReadString('\n')
			ch <- line{i, strings.TrimSuffix(s, "\n"), err}
		}()
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	out := make([]string, len(procs))
	var failed error
	for range procs {
		var l line
		select {
		case l = <-ch:
		case <-timer.C:
			if failed == nil {
				failed = fmt.Errorf("no answer within %v", timeout)
			}
			cancel()
			l = <-ch
		}
		out[l.i] = l.s
		if l.err != nil && failed == nil {
			cancel()
			p := procs[l.i]
			_ = p.cmd.Wait()
			failed = fmt.Errorf("worker %d: %v: %s", l.i, l.err, strings.TrimSpace(p.stderr.String()))
		}
	}
	return out, failed
}
