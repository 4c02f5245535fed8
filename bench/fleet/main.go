// Command fleet measures a fleet-wide rate limit on Redis across OS
// processes: guardrail's fleet.Limiter on redisfleet (leased tokens spent
// locally) beside github.com/go-redis/redis_rate (one round trip per
// request), with the same limit per key, the same offered load spread
// unevenly over the processes (one of them gets half), and, for a row of
// each, the Redis server killed mid-run and started again. It prints one
// JSON row per run. See README.md.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/extra/redisstore/redisfleet"
	"github.com/guardrail-go/guardrail/fleet"
)

// childEnv, when set, makes the binary one process of the fleet: it holds
// the childConfig as JSON.
const childEnv = "GUARDRAIL_FLEET_BENCH_CHILD"

// bucket is the resolution of the admitted counts.
const bucket = 100 * time.Millisecond

func main() {
	if cfg := os.Getenv(childEnv); cfg != "" {
		if err := childMain(cfg, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "fleet child:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	Addr      string
	Impls     []string
	Processes int
	Limit     float64
	Burst     int
	Offered   float64
	Duration  time.Duration
	Warmup    time.Duration
	Steady    bool
	Outage    bool
	OutageAt  time.Duration
	OutageFor time.Duration
	Workers   int
	Series    string
}

func parse(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	addr := os.Getenv("GUARDRAIL_TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	fs.StringVar(&o.Addr, "addr", addr, "the Redis of the steady rows (default $GUARDRAIL_TEST_REDIS_ADDR)")
	impls := fs.String("impl", "guardrail,redis_rate", "the implementations, comma-separated")
	fs.IntVar(&o.Processes, "processes", 8, "OS processes sharing the limit")
	fs.Float64Var(&o.Limit, "limit", 1000, "the fleet-wide limit, requests a second for the one key")
	fs.IntVar(&o.Burst, "burst", 200, "the limit's burst")
	fs.Float64Var(&o.Offered, "offered", 3000, "requests a second offered to the whole fleet; one process gets half")
	fs.DurationVar(&o.Duration, "duration", 20*time.Second, "the length of each run")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "the start of each run left out of the windows (the bucket starts full)")
	fs.BoolVar(&o.Steady, "steady", true, "run each implementation against the Redis of -addr")
	fs.BoolVar(&o.Outage, "outage", true, "also run each implementation against a Redis of its own that is killed mid-run (needs redis-server on PATH)")
	fs.DurationVar(&o.OutageAt, "outage-at", 6*time.Second, "when the Redis of the outage rows is killed")
	fs.DurationVar(&o.OutageFor, "outage-for", 5*time.Second, "how long it stays down")
	fs.IntVar(&o.Workers, "workers", 4, "goroutines per process sending requests")
	fs.StringVar(&o.Series, "series", "", "if set, a file to write each run's admitted count per 100 ms to, a JSON line per run")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.Impls = strings.Split(*impls, ",")
	for _, i := range o.Impls {
		if i != "guardrail" && i != "redis_rate" {
			return o, fmt.Errorf("-impl %q: want guardrail or redis_rate", i)
		}
	}
	if o.Processes < 2 || o.Limit <= 0 || o.Burst < 1 || o.Offered <= 0 || o.Duration <= o.Warmup {
		return o, errors.New("want -processes of 2 or more, a positive -limit, -burst and -offered, and -duration above -warmup")
	}
	return o, nil
}

// row is one line of output.
type row struct {
	Impl                 string  `json:"impl"`
	Processes            int     `json:"processes"`
	Limit                float64 `json:"limit"`
	Burst                int     `json:"burst"`
	OfferedRPS           float64 `json:"offered_rps"`
	AdmittedRPS          float64 `json:"admitted_rps"`
	ErrorPct             float64 `json:"error_pct"`
	RoundTripsPerRequest float64 `json:"redis_round_trips_per_request"`
	RoundTripsPerOffered float64 `json:"redis_round_trips_per_offered"`
	P99AddedUS           float64 `json:"p99_added_us"`
	Worst1sDevPct        float64 `json:"worst_1s_dev_pct"`
	Worst10sDevPct       float64 `json:"worst_10s_dev_pct"`
	BusiestSharePct      float64 `json:"busiest_process_share_pct"`
	RedisKilledS         float64 `json:"redis_killed_s,omitempty"`
	RecoveredFirstMS     float64 `json:"first_recovered_ms_after_return,omitempty"`
	RecoveredMS          float64 `json:"recovered_ms_after_return,omitempty"`
	Worst1sKillPct       float64 `json:"worst_1s_dev_at_kill_pct,omitempty"`
	Worst1sReturnPct     float64 `json:"worst_1s_dev_at_return_pct,omitempty"`
	Worst1sAfterPct      float64 `json:"worst_1s_dev_1s_after_recovery_pct,omitempty"`
	Seconds              float64 `json:"measured_s"`
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	for _, impl := range o.Impls {
		if !o.Steady {
			break
		}
		r, err := runOnce(o, impl, o.Addr, nil)
		if err != nil {
			return err
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	if !o.Outage {
		return nil
	}
	for _, impl := range o.Impls {
		srv, err := startRedis()
		if err != nil {
			return err
		}
		r, err := runOnce(o, impl, srv.addr, srv)
		srv.stop()
		if err != nil {
			return err
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// childConfig is what one process of the fleet runs.
type childConfig struct {
	Impl      string
	Addr      string
	Key       string
	Limit     float64
	Burst     int
	RPS       float64
	Start     int64 // unix ns
	Duration  time.Duration
	Processes int
	Workers   int
}

// childResult is what it reports.
type childResult struct {
	Buckets    []int      // admitted per bucket from Start
	Offered    int        //
	Admitted   int        //
	Errors     int        // neither admitted nor refused: the limiter failed
	RoundTrips int64      // commands sent to Redis, pipelines counted once
	Latency    [][2]int64 // µs, count
	// RecoveredAt is when the limiter last stopped failing (unix ns), 0
	// if it never failed; guardrail only.
	RecoveredAt int64
}

func runOnce(o options, impl, addr string, srv *redisServer) (row, error) {
	exe, err := os.Executable()
	if err != nil {
		return row{}, err
	}
	key := fmt.Sprintf("bench-%d", rand.Int64())
	start := time.Now().Add(1500 * time.Millisecond) // time for every process to start and connect
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for i := range o.Processes {
		rps := o.Offered / 2
		if i > 0 {
			rps = o.Offered / 2 / float64(o.Processes-1)
		}
		cfg, _ := json.Marshal(childConfig{
			Impl: impl, Addr: addr, Key: key, Limit: o.Limit, Burst: o.Burst, RPS: rps,
			Start: start.UnixNano(), Duration: o.Duration, Processes: o.Processes, Workers: o.Workers,
		})
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), childEnv+"="+string(cfg))
		out := new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = out, os.Stderr
		if err := cmd.Start(); err != nil {
			return row{}, err
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	var killedFor time.Duration
	var killed, back time.Time
	if srv != nil {
		time.Sleep(time.Until(start.Add(o.OutageAt)))
		srv.kill()
		killed = time.Now()
		time.Sleep(o.OutageFor)
		if err := srv.start(); err != nil {
			return row{}, err
		}
		back = time.Now()
		killedFor = o.OutageFor
	}
	var results []childResult
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			return row{}, fmt.Errorf("process %d: %v", i, err)
		}
		var r childResult
		if err := json.Unmarshal(outs[i].Bytes(), &r); err != nil {
			return row{}, fmt.Errorf("process %d: %v", i, err)
		}
		results = append(results, r)
	}
	r := summarize(o, impl, results)
	if o.Series != "" {
		f, err := os.OpenFile(o.Series, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return row{}, err
		}
		err = json.NewEncoder(f).Encode(struct {
			Impl     string `json:"impl"`
			Outage   bool   `json:"outage"`
			Admitted []int  `json:"admitted_per_100ms"`
		}{impl, srv != nil, merge(results)})
		f.Close()
		if err != nil {
			return row{}, err
		}
	}
	if srv != nil {
		r.RedisKilledS = killedFor.Seconds()
		// The limiters see Redis again when their client reconnects (and
		// go-redis's pool, after PoolSize failed dials in a row, dials
		// again once a second); redis_rate has no state to recover.
		seen, first := back, time.Time{}
		for _, c := range results {
			if c.RecoveredAt == 0 {
				continue
			}
			t := time.Unix(0, c.RecoveredAt)
			if t.After(seen) {
				seen = t
			}
			if first.IsZero() || t.Before(first) {
				first = t
			}
		}
		r.RecoveredMS = math.Round(float64(seen.Sub(back)) / 1e6)
		if !first.IsZero() {
			r.RecoveredFirstMS = math.Round(float64(first.Sub(back)) / 1e6)
		}
		all := merge(results)
		from := int((seen.Sub(start) + time.Second + bucket - 1) / bucket)
		r.Worst1sAfterPct = worstWindow(all, from, 10, o.Limit)
		// The windows that hold the kill or the return, or start within a
		// second after the kill, or two after the return (the processes
		// see Redis again at different times).
		k, b := int(killed.Sub(start)/bucket), int(back.Sub(start)/bucket)
		r.Worst1sKillPct = worstWindowIn(all, k-9, k+10, 10, o.Limit)
		r.Worst1sReturnPct = worstWindowIn(all, b-9, b+20, 10, o.Limit)
	}
	return r, nil
}

// merge adds the processes' buckets.
func merge(results []childResult) []int {
	var all []int
	for _, r := range results {
		for i, n := range r.Buckets {
			for len(all) <= i {
				all = append(all, 0)
			}
			all[i] += n
		}
	}
	return all
}

// worstWindow is the largest deviation, in percent of the limit, of the
// admitted count over any window of width buckets starting at or after
// bucket from (and ending within the run).
func worstWindow(all []int, from, width int, limit float64) float64 {
	return worstWindowIn(all, from, len(all), width, limit)
}

// worstWindowIn is worstWindow over the windows starting in [from, to].
func worstWindowIn(all []int, from, to, width int, limit float64) float64 {
	want := limit * float64(width) * bucket.Seconds()
	worst := 0.0
	for i := max(from, 0); i <= to && i+width <= len(all); i++ {
		n := 0
		for _, c := range all[i : i+width] {
			n += c
		}
		if d := (float64(n) - want) / want * 100; math.Abs(d) > math.Abs(worst) {
			worst = d
		}
	}
	return math.Round(worst*10) / 10
}

func summarize(o options, impl string, results []childResult) row {
	all := merge(results)
	from := int(o.Warmup / bucket)
	n := int(o.Duration / bucket)
	all = append(all, make([]int, max(n-len(all), 0))...)[:n]
	admitted := 0
	for _, c := range all[from:] {
		admitted += c
	}
	secs := float64(n-from) * bucket.Seconds()
	var offered, admittedAll, errs int
	var rt int64
	hist := map[int64]int64{}
	for _, r := range results {
		offered += r.Offered
		admittedAll += r.Admitted
		errs += r.Errors
		rt += r.RoundTrips
		for _, l := range r.Latency {
			hist[l[0]] += l[1]
		}
	}
	return row{
		Impl: impl, Processes: o.Processes, Limit: o.Limit, Burst: o.Burst,
		OfferedRPS:           math.Round(float64(offered) / o.Duration.Seconds()),
		AdmittedRPS:          math.Round(float64(admitted)/secs*10) / 10,
		ErrorPct:             round3(float64(errs) / float64(max(offered, 1)) * 100),
		RoundTripsPerRequest: round3(float64(rt) / float64(max(admittedAll, 1))),
		RoundTripsPerOffered: round3(float64(rt) / float64(max(offered, 1))),
		P99AddedUS:           float64(quantile(hist, 0.99)),
		Worst1sDevPct:        worstWindow(all, from, int(time.Second/bucket), o.Limit),
		Worst10sDevPct:       worstWindow(all, from, int(10*time.Second/bucket), o.Limit),
		BusiestSharePct:      math.Round(float64(results[0].Admitted) / float64(max(admittedAll, 1)) * 1000 / 10),
		Seconds:              secs,
	}
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

func quantile(hist map[int64]int64, q float64) int64 {
	keys := make([]int64, 0, len(hist))
	var total int64
	for k, v := range hist {
		keys = append(keys, k)
		total += v
	}
	slices.Sort(keys)
	need := int64(math.Ceil(q * float64(total)))
	var seen int64
	for _, k := range keys {
		seen += hist[k]
		if seen >= need {
			return k
		}
	}
	return 0
}

// counter counts the commands a client sends: the round trips.
type counter struct{ n atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// storeTimeout bounds every call to Redis, in both implementations.
const storeTimeout = 50 * time.Millisecond

func childMain(cfgJSON string, stdout io.Writer) error {
	var cfg childConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return err
	}
	client := redis.NewClient(&redis.Options{
		Addr: cfg.Addr, ContextTimeoutEnabled: true,
		DialTimeout: storeTimeout, ReadTimeout: storeTimeout, WriteTimeout: storeTimeout,
		MaxRetries: -1,
	})
	defer client.Close()
	redis.SetLogger(quiet{})
	var rt counter
	client.AddHook(&rt)

	var recoveredAt atomic.Int64
	var allow func(ctx context.Context) (ok bool, err error)
	var closeFn func()
	switch cfg.Impl {
	case "guardrail":
		store, err := redisfleet.New(client, redisfleet.Config{Prefix: "guardrail-bench:"})
		if err != nil {
			return err
		}
		l, err := fleet.NewLimiter(fleet.LimiterConfig{
			Store: store, Rate: cfg.Limit, Burst: cfg.Burst,
			StoreTimeout: storeTimeout, Members: fleet.Fixed(cfg.Processes),
		})
		if err != nil {
			return err
		}
		allow = func(ctx context.Context) (bool, error) {
			err := l.Allow(ctx, cfg.Key)
			if err == nil {
				return true, nil
			}
			if errors.Is(err, fleet.ErrLimited) {
				return false, nil
			}
			return false, err
		}
		// Watch the limiter's failure state, to report when it saw Redis
		// again.
		done := make(chan struct{})
		var watched sync.WaitGroup
		watched.Go(func() {
			failing := false
			for {
				select {
				case <-done:
					return
				case <-time.After(5 * time.Millisecond):
				}
				f := l.Stats().Failing
				if failing && !f {
					recoveredAt.Store(time.Now().UnixNano())
				}
				failing = f
			}
		})
		closeFn = func() {
			close(done)
			watched.Wait()
			_ = l.Close()
		}
	case "redis_rate":
		l := redis_rate.NewLimiter(client)
		lim := redis_rate.Limit{Rate: int(cfg.Limit), Burst: cfg.Burst, Period: time.Second}
		allow = func(ctx context.Context) (bool, error) {
			ctx, cancel := context.WithTimeout(ctx, storeTimeout)
			defer cancel()
			res, err := l.Allow(ctx, cfg.Key, lim)
			if err != nil {
				return false, err
			}
			return res.Allowed > 0, nil
		}
		closeFn = func() {}
	}
	// Connect before the start, as a server would before taking traffic.
	_ = client.Ping(context.Background()).Err()

	start := time.Unix(0, cfg.Start)
	n := int(cfg.Duration / bucket)
	buckets := make([]atomic.Int64, n+1)
	var offered, admitted, errs atomic.Int64
	lat := make([]map[int64]int64, cfg.Workers)
	work := make(chan struct{}, 100_000)
	var wg sync.WaitGroup
	for w := range cfg.Workers {
		lat[w] = map[int64]int64{}
		wg.Go(func() {
			for range work {
				t0 := time.Now()
				ok, err := allow(context.Background())
				el := time.Since(t0)
				lat[w][el.Microseconds()]++
				switch {
				case err != nil:
					errs.Add(1)
				case ok:
					admitted.Add(1)
					if i := int(t0.Sub(start) / bucket); i >= 0 && i < len(buckets) {
						buckets[i].Add(1)
					}
				}
			}
		})
	}
	time.Sleep(time.Until(start))
	sent := 0
	for {
		el := time.Since(start)
		if el >= cfg.Duration {
			break
		}
		for due := int(el.Seconds() * cfg.RPS); sent < due; sent++ {
			work <- struct{}{}
		}
		time.Sleep(200 * time.Microsecond)
	}
	close(work)
	wg.Wait()
	offered.Store(int64(sent))
	closeFn()

	res := childResult{
		Offered: int(offered.Load()), Admitted: int(admitted.Load()), Errors: int(errs.Load()),
		RoundTrips: rt.n.Load(), RecoveredAt: recoveredAt.Load(),
	}
	for i := range n {
		res.Buckets = append(res.Buckets, int(buckets[i].Load()))
	}
	merged := map[int64]int64{}
	for _, m := range lat {
		for k, v := range m {
			merged[k] += v
		}
	}
	for k, v := range merged {
		res.Latency = append(res.Latency, [2]int64{k, v})
	}
	return json.NewEncoder(stdout).Encode(res)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// redisServer is a redis-server of the run's own, for the outage rows.
type redisServer struct {
	bin, dir, port, addr string
	cmd                  *exec.Cmd
}

func startRedis() (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("the outage rows need redis-server on PATH (or run with -outage=false): %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	dir, err := os.MkdirTemp("", "fleet-bench-redis-")
	if err != nil {
		return nil, err
	}
	s := &redisServer{bin: bin, dir: dir, port: port, addr: "127.0.0.1:" + port}
	return s, s.start()
}

func (s *redisServer) start() error {
	s.cmd = exec.Command(s.bin, "--port", s.port, "--bind", "127.0.0.1", "--dir", s.dir, "--save", "", "--appendonly", "no")
	log, err := os.Create(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr, 100*time.Millisecond)
		if err == nil {
			_, _ = c.Write([]byte("PING\r\n"))
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.HasPrefix(line, "+PONG") {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer", s.addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *redisServer) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

func (s *redisServer) stop() {
	s.kill()
	os.RemoveAll(s.dir)
}
