package lab

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// synthRun is a run of 100 ms buckets of 30 requests each, trigger from 0.5 s
// to 1.5 s, with the given successes per bucket.
func synthRun(ok ...int64) *incRun {
	res := &incRun{step: 100 * time.Millisecond, trigStart: 500 * time.Millisecond, trigEnd: 1500 * time.Millisecond}
	for _, v := range ok {
		res.offered = append(res.offered, 30)
		res.ok = append(res.ok, v)
	}
	res.end = time.Duration(len(ok)) * res.step
	return res
}

func TestIncidentRecoveryMetric(t *testing.T) {
	p := incParams{recoverFrac: 0.9, holdFor: time.Second}
	up := func(n int) []int64 { return fill(n, 30) }
	down := func(n int) []int64 { return fill(n, 0) }
	cat := func(parts ...[]int64) []int64 {
		var out []int64
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		ok       []int64
		recovery time.Duration
		degraded time.Duration
	}{
		{"back at once", cat(up(5), down(10), up(15)), 0, 0},
		{"back 300ms after", cat(up(5), down(13), up(12)), 300 * time.Millisecond, 300 * time.Millisecond},
		// 27 of 30 is 90 %: enough. 26 is not.
		{"at 90% exactly", cat(up(5), down(10), fill(10, 27), up(5)), 0, 0},
		{"just under 90%", cat(up(5), down(10), fill(10, 26), down(5)), -1, 0},
		// A dip inside the hold restarts it.
		{"dip in the hold", cat(up(5), down(10), up(5), down(1), up(10)), 600 * time.Millisecond, 0},
		// A second of good buckets is needed before the run ends.
		{"too late to confirm", cat(up(5), down(20), up(9)), -1, 1000 * time.Millisecond},
		{"never", cat(up(5), down(25)), -1, -1},
		{"half is not degraded", cat(up(5), down(10), fill(20, 15)), -1, 0},
	} {
		res := synthRun(tc.ok...)
		if got := res.recoveryFrom(p, res.trigEnd); got != tc.recovery {
			t.Errorf("%s: recovery %v, want %v", tc.name, got, tc.recovery)
		}
		if got := res.degradedFrom(p, res.trigEnd); got != tc.degraded {
			t.Errorf("%s: degraded %v, want %v", tc.name, got, tc.degraded)
		}
	}
}

func fill(n int, v int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// The DB fails over as the incident needs: refusing, it refuses
// connections and loses its queue; back, it serves on the same address;
// hanging, it accepts and never answers, and keeps hanging the requests it
// took during the outage after it.
func TestIncidentDBFailsOver(t *testing.T) {
	for _, variant := range []string{"refuse", "hang"} {
		t.Run(variant, func(t *testing.T) {
			runCtx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p := incParams{workers: 2, service: time.Millisecond}
			start := time.Now()
			db := &incDB{p: p, runCtx: runCtx, in: newCounters(start, time.Second, time.Minute),
				ran: newCounters(start, time.Second, time.Minute), lost: newCounters(start, time.Second, time.Minute)}
			db.cond = sync.NewCond(&db.mu)
			db.handler = db
			if err := db.listen(); err != nil {
				t.Fatal(err)
			}
			first := *db.addr.Load()
			for range p.workers {
				db.workers.Go(db.work)
			}
			defer db.close()
			viaName := func(c *http.Client) *http.Client {
				c.Transport.(*http.Transport).DialContext = db.dial((&net.Dialer{}).DialContext)
				return c
			}
			c := viaName(newHTTPClient(true))
			defer c.CloseIdleConnections()
			url := "http://" + dbHost + "/"
			if _, err := get(context.Background(), c, url); err != nil {
				t.Fatalf("before the outage: %v", err)
			}

			db.fail(variant)
			var hung sync.WaitGroup
			hungErr := make(chan error, 1)
			switch variant {
			case "refuse":
				_, err := get(context.Background(), c, url)
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Fatalf("during the outage: %v, want a refused connection", err)
				}
			case "hang":
				// A request made during the outage: it must not be answered,
				// even after the DB is back.
				ctx, cancelHung := context.WithCancel(context.Background())
				defer cancelHung()
				hung.Go(func() {
					_, err := get(ctx, viaName(newHTTPClient(false)), url)
					hungErr <- err
				})
				ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
				_, err := get(ctx2, c, url)
				cancel2()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("during the outage: %v, want no answer until the client gave up", err)
				}
				defer func() {
					cancelHung()
					hung.Wait()
				}()
			}
			if err := db.recover(variant); err != nil {
				t.Fatal(err)
			}
			// A fresh connection: the old pool's may be the hung ones.
			c2 := viaName(newHTTPClient(false))
			if _, err := get(context.Background(), c2, url); err != nil {
				t.Fatalf("after the outage: %v", err)
			}
			// A primary that refused comes back on a new port, behind the
			// same name: no port is bound twice.
			if again := *db.addr.Load(); (variant == "refuse") != (again != first) {
				t.Errorf("%s: listener %s before the outage, %s after", variant, first, again)
			}
			if variant == "hang" {
				select {
				case err := <-hungErr:
					t.Fatalf("the request made during the hang was answered after it: %v", err)
				default:
				}
			}
			if got := db.ran.snapshot(1)[0]; got != 2 {
				t.Errorf("the DB ran %d queries, want 2 (one before, one after the outage)", got)
			}
		})
	}
}

// The DB runs every query it took, whoever still waits: work for a user who
// has given up is counted as wasted.
func TestIncidentDBCountsWastedWork(t *testing.T) {
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	db := &incDB{p: incParams{workers: 1, service: 20 * time.Millisecond}, runCtx: runCtx, in: newCounters(start, time.Minute, time.Hour),
		ran: newCounters(start, time.Minute, time.Hour), lost: newCounters(start, time.Minute, time.Hour)}
	db.cond = sync.NewCond(&db.mu)
	db.handler = db
	s, err := serve(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db.workers.Go(db.work)
	defer db.close()
	// Ten requests whose users gave up already (their data-service still
	// waits, as the naive one does), and one whose user still waits.
	c := newHTTPClient(true)
	defer c.CloseIdleConnections()
	var wg sync.WaitGroup
	for i := range 11 {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, s.URL, nil)
			if i < 10 {
				req.Header.Set(headerUserDeadline, fmt.Sprint(time.Now().Add(-time.Second).UnixNano()))
			} else {
				req.Header.Set(headerUserDeadline, fmt.Sprint(time.Now().Add(time.Hour).UnixNano()))
			}
			if resp, err := c.Do(req); err != nil {
				t.Error(err)
			} else {
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	if ran, lost := db.ran.snapshot(1)[0], db.lost.snapshot(1)[0]; ran != 11 || lost != 10 {
		t.Errorf("ran %d, wasted %d; want 11 run, 10 of them wasted", ran, lost)
	}
}

// A small incident: the refused variant of the failover at half the rate on
// half the pool, an outage past the threshold. Naive must stay down after
// the DB is back, guarded must come back within a second, dropping the load
// must bring naive back, and the numbers must add up. The run is real time
// on loopback: when its load fell behind its schedule (a busy machine) the
// run measured the machine, and the test skips rather than fail.
func TestIncident(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an incident in real time")
	}
	e, _ := Lookup("incident")
	fs := flag.NewFlagSet("incident", flag.ContinueOnError)
	run := e.Setup(fs, true)
	if err := fs.Parse([]string{"--rps", "150", "--workers", "5", "--outages", "2s", "--max-outage", "2s", "--variants", "refuse",
		"--after", "2s", "--pool", "256"}); err != nil {
		t.Fatal(err)
	}
	res, err := run(context.Background(), &Env{Quick: true, Seed: 1, Progress: func(string, ...any) {}})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	WriteTable(&buf, res)
	t.Log(buf.String())
	problems, judged := incidentProblems(t, res)
	if len(problems) > 0 {
		t.Errorf("the incident did not behave:\n%s", strings.Join(problems, "\n"))
	}
	if !judged {
		t.Skip("a run's load fell behind its schedule: this machine is too busy to judge the incident")
	}
}

// incidentProblems returns what contradicts the incident in res, and whether
// res was judged at all (every run kept its schedule). Counts are checked
// whatever the machine did.
func incidentProblems(t *testing.T, res *Result) (problems []string, judged bool) {
	t.Helper()
	judged = true
	for _, c := range res.Failed() {
		problems = append(problems, "check failed: "+c.Name+": "+c.Detail)
	}
	byLabel := map[string]Row{}
	for _, r := range res.Rows {
		byLabel[r.Label] = r
		if !col(t, r, "measured").(bool) {
			judged = false
		}
	}
	naive, guarded, proof := byLabel["naive refuse 2s"], byLabel["guarded refuse 2s"], byLabel["naive refuse 2s + load dropped"]
	if naive.Label == "" || guarded.Label == "" {
		t.Fatalf("rows %v lack naive or guarded refuse 2s", res.Rows)
	}
	// Counts hold however busy the machine: every request sent is counted
	// once, and the guarded DB sees at most one call per request plus the
	// budget's retries.
	// Naive runs its whole schedule (warmup, outage, 2 s after); guarded
	// stops once its recovery has held 1 s.
	if got := col(t, naive, "requests").(int); got != 675 {
		problems = append(problems, fmt.Sprintf("naive: %d requests, want the 4.5 s schedule at 150 rps (675)", got))
	}
	if got := col(t, guarded, "requests").(int); got < 525 || got > 675 {
		problems = append(problems, fmt.Sprintf("guarded: %d requests, want from 3.5 s at 150 rps (the warmup, the outage, the hold; 525) to the 4.5 s schedule (675)", got))
	}
	if calls, reqs := col(t, guarded, "db_calls").(int), col(t, guarded, "requests").(int); float64(calls) > 1.1*float64(reqs)+10 {
		problems = append(problems, fmt.Sprintf("guarded: %d DB calls for %d requests, want at most 1.1 x requests + 10", calls, reqs))
	}
	if !judged {
		return problems, false
	}
	if got := col(t, naive, "recovery_ms"); got != nil {
		problems = append(problems, fmt.Sprintf("naive: recovery %v, want none: it stays down after the DB is back", got))
	}
	if got, ok := col(t, guarded, "recovery_ms").(time.Duration); !ok || got > time.Second {
		problems = append(problems, fmt.Sprintf("guarded: recovery %v, want within 1s", col(t, guarded, "recovery_ms")))
	}
	if n, g := col(t, naive, "peak_db_calls_per_request").(float64), col(t, guarded, "peak_db_calls_per_request").(float64); n < 2*g {
		problems = append(problems, fmt.Sprintf("peak DB calls per request: naive %.2f, guarded %.2f, want the storm at least twice the guarded load", n, g))
	}
	if g := col(t, guarded, "wasted_db_work_pct").(float64); g > 5 {
		problems = append(problems, fmt.Sprintf("guarded wasted %.1f%% of the DB's work, want under 5%%", g))
	}
	if proof.Label == "" {
		problems = append(problems, "no row with the load dropped: the metastability proof did not run")
	} else if col(t, proof, "recovery_after_relief_ms") == nil {
		problems = append(problems, "naive with the load dropped did not recover after the load came back")
	}
	if len(res.Charts) < 3 {
		problems = append(problems, fmt.Sprintf("%d charts, want goodput over time, recovery against the outage and the proof", len(res.Charts)))
	}
	return problems, true
}

// Every parameter is a flag; a quick run makes one outage past the
// threshold, of the refused variant.
func TestIncidentFlags(t *testing.T) {
	e, ok := Lookup("incident")
	if !ok {
		t.Fatal("incident is not registered")
	}
	fs := flag.NewFlagSet("incident", flag.ContinueOnError)
	e.Setup(fs, true)
	for name, want := range map[string]string{"rps": "300", "workers": "10", "service": "20ms", "user-deadline": "1s",
		"outages": "2s", "variants": "refuse", "naive-attempts": "4", "naive-backoff": "100ms", "naive-jitter": "100ms",
		"bff-timeout": "2s", "service-timeout": "5s", "db-timeout": "30s", "budget": "0.1", "configs": "naive,guarded"} {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("no --%s flag", name)
			continue
		}
		if f.DefValue != want {
			t.Errorf("--%s defaults to %s in a quick run, want %s", name, f.DefValue, want)
		}
	}
	full := flag.NewFlagSet("incident", flag.ContinueOnError)
	e.Setup(full, false)
	if got := full.Lookup("outages").DefValue; got != "500ms,1s,2s,4s" {
		t.Errorf("--outages defaults to %s in a full run, want 500ms,1s,2s,4s", got)
	}
	if got := full.Lookup("variants").DefValue; got != "refuse,hang" {
		t.Errorf("--variants defaults to %s in a full run, want refuse,hang", got)
	}
}

func TestIncidentRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--rps", "0"},
		{"--workers", "0"},
		{"--outages", "1s,soon"},
		{"--outages", "-1s"},
		{"--variants", "flood"},
		{"--configs", "careful"},
		{"--naive-attempts", "0"},
		{"--budget", "-0.1"},
		{"--relief-rate", "1"},
		{"--recover-at", "1.5"},
		{"--step", "0s"},
	} {
		e, _ := Lookup("incident")
		fs := flag.NewFlagSet("incident", flag.ContinueOnError)
		run := e.Setup(fs, true)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if _, err := run(context.Background(), &Env{Quick: true, Seed: 1, Progress: func(string, ...any) {}}); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// A run whose load fell behind its schedule measured the machine: its
// timing checks are not judged, never failed, even when its numbers are
// bad; the counts are judged whatever the machine did.
func TestIncidentBusyMachineIsNotJudged(t *testing.T) {
	p := incParams{rps: 300, workers: 10, service: 20 * time.Millisecond, userDeadline: time.Second, recoverFrac: 0.9,
		holdFor: time.Second, recoveryTarget: time.Second, budgetRatio: 0.1, reliefFor: time.Second}
	down := func() *incRun {
		res := synthRun(append(fill(5, 30), fill(25, 0)...)...)
		res.dbIn = fill(30, 0)
		res.rateWanted, res.sendRate, res.lagP99 = 300, 300, 300*time.Millisecond // a stalled machine
		return res
	}
	rows := []incRow{
		{variant: "refuse", outage: time.Second, res: down()},
		{variant: "refuse", outage: time.Second, guarded: true, res: down()},
		{variant: "refuse", outage: time.Second, relief: true, res: down()},
	}
	rows[2].res.reliefStart, rows[2].res.reliefEnd = 1600*time.Millisecond, 2000*time.Millisecond
	for i := range rows {
		p.judge(&rows[i])
		if rows[i].measured {
			t.Fatalf("%s: a p99 start lag of 300ms counts as measured", rows[i].name())
		}
	}
	r := &Result{}
	p.checks(r, rows, map[string]time.Duration{"refuse": time.Second}, nil)
	var judged, notJudged int
	for _, c := range r.Checks {
		switch {
		case c.Verdict == Fail:
			t.Errorf("failed on a busy machine: %s: %s", c.Name, c.Detail)
		case c.Verdict == NotJudged:
			notJudged++
		case strings.Contains(c.Name, "retry budget"):
			judged++
		}
	}
	if notJudged != 4 || judged != 1 {
		t.Errorf("%d checks not judged, %d judged (%v); want 4 (naive degraded, guarded recovery and DB load, the proof) and the budget's count", notJudged, judged, r.Checks)
	}
}

// A run whose check is a recovery lasts long enough to decide it, however
// short --after: the quick run once cut a guarded run 1.5 s after the
// outage, before a recovery within 1 s could be held for 1 s, and failed it.
func TestIncidentRunsLongEnoughToDecide(t *testing.T) {
	e, _ := Lookup("incident")
	fs := flag.NewFlagSet("incident", flag.ContinueOnError)
	e.Setup(fs, true)
	var p incParams
	// The quick defaults, read back from the flags.
	for _, name := range []string{"after", "hold", "recovery-target", "step", "warmup", "relief-after", "relief-for"} {
		if fs.Lookup(name) == nil {
			t.Fatalf("no --%s flag", name)
		}
	}
	get := func(name string) time.Duration {
		d, err := time.ParseDuration(fs.Lookup(name).Value.String())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	p.after, p.holdFor, p.recoveryTarget, p.step, p.warmup = get("after"), get("hold"), get("recovery-target"), get("step"), get("warmup")
	p.reliefAfter, p.reliefFor = get("relief-after"), get("relief-for")
	need := p.recoveryTarget + p.holdFor
	for _, outage := range []time.Duration{500 * time.Millisecond, 2 * time.Second} {
		_, trigEnd, _, end := p.schedule(true, outage, false)
		if end-trigEnd < need {
			t.Errorf("guarded, outage %v: the run ends %v after the outage, want at least %v (the target, then the hold)", outage, end-trigEnd, need)
		}
		_, _, reliefStart, end := p.schedule(false, outage, true)
		if end-(reliefStart+p.reliefFor) < need {
			t.Errorf("load dropped, outage %v: the run ends %v after the longest relief, want at least %v", outage, end-(reliefStart+p.reliefFor), need)
		}
	}
}

// A relief lasts until the whole system has drained, not only the DB's
// queue: a retry chain waiting in a tier's pool holds that tier's handler,
// and the handler set counts it. (A relief once ended after 100 ms with the
// DB's queue empty and thousands of chains still waiting upstream.)
func TestIncidentHandlersInFlight(t *testing.T) {
	var hs handlerSet
	release := make(chan struct{})
	entered := make(chan struct{}, 3)
	s, err := serve(hs.track(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := newHTTPClient(false)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { _, _ = get(context.Background(), c, s.URL) })
	}
	for range 3 {
		<-entered
	}
	if got := hs.inFlight.Load(); got != 3 {
		t.Errorf("%d handlers in flight, want 3", got)
	}
	close(release)
	wg.Wait()
	hs.wg.Wait()
	if got := hs.inFlight.Load(); got != 0 {
		t.Errorf("%d handlers in flight after they returned, want 0", got)
	}
}

// The threshold is taken from the majority of the runs near it, so one run
// that recovered by luck does not move it.
func TestTipThreshold(t *testing.T) {
	sweep := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second}
	for _, c := range []struct {
		name string
		tips []tipCount
		want time.Duration
	}{
		{"once each", []tipCount{{0, 1}, {0, 1}, {1, 1}, {1, 1}}, 2 * time.Second},
		{"2s tipped in 2 of 3", []tipCount{{0, 1}, {0, 2}, {2, 3}, {1, 1}}, 2 * time.Second},
		{"2s tipped in 1 of 3", []tipCount{{0, 1}, {0, 1}, {1, 3}, {1, 1}}, 4 * time.Second},
		{"1s tipped in 2 of 2", []tipCount{{0, 1}, {2, 2}, {2, 2}, {1, 1}}, time.Second},
		{"never", []tipCount{{0, 1}, {0, 1}, {0, 1}, {0, 2}}, -1},
	} {
		if got := tipThreshold(sweep, c.tips); got != c.want {
			t.Errorf("%s: threshold %v, want %v", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		t    tipCount
		n    int
		want bool
	}{
		{tipCount{1, 1}, 1, true}, {tipCount{1, 1}, 3, false}, {tipCount{2, 2}, 3, true},
		{tipCount{1, 2}, 3, false}, {tipCount{1, 3}, 3, true}, {tipCount{0, 2}, 3, true},
	} {
		if got := c.t.decided(c.n); got != c.want {
			t.Errorf("%+v decided at best of %d: %v, want %v", c.t, c.n, got, c.want)
		}
	}
}
