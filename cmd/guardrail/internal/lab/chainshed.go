package lab

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/shed"
)

// The shedding part of the chain experiment: a front that needs two
// backends for every request, both overloaded, shedding independently or
// by cohort.
const (
	chainIndependent = "independent" // each backend sheds whichever requests find it full
	chainConsistent  = "consistent"  // backends shed by cohort; the front refuses at its door below their level
)

// chainShedParams are the shedding part's settings, from the chain
// experiment's flags.
type chainShedParams struct {
	overload float64       // offered load over a backend's capacity
	slots    int           // a backend's concurrent requests
	work     time.Duration // a backend's time per request
	dur      time.Duration // the run
	users    int           // distinct user keys
}

// capacity is a backend's requests per second.
func (s chainShedParams) capacity() float64 { return float64(s.slots) / s.work.Seconds() }

// chainShedRun is what one shedding run measured.
type chainShedRun struct {
	offered, ok int64 // user requests sent, and answered 200
	worked      int64 // requests a backend did its work for
	wasted      int64 // of those, for a user request that failed
	frontRefuse int64 // refused at the front's door, before any work
	sched       schedule
}

func (r *chainShedRun) goodputPct() float64 { return pct(int(r.ok), int(r.offered)) }
func (r *chainShedRun) wastedPct() float64  { return pct(int(r.wasted), int(r.worked)) }

// runShedding runs both configurations at once and adds their rows and
// checks to r.
func (p chainParams) runShedding(ctx context.Context, env *Env, r *Result) error {
	sp := p.shed
	env.Progress("chain: shedding at %gx overload, independent and consistent at once", sp.overload)
	probe := probeQuiet(ctx)
	cfgs := []string{chainIndependent, chainConsistent}
	runs := make([]*chainShedRun, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() { runs[i], errs[i] = p.shedOne(ctx, cfg, int64(i)) })
	}
	wg.Wait()
	quiet := probe.stop()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	judged := quiet.quiet() && runs[0].sched.kept() && runs[1].sched.kept()
	for i, cfg := range cfgs {
		res := runs[i]
		r.add(fmt.Sprintf("%s shedding, %gx overload", cfg, sp.overload),
			Str("config", cfg+" shedding").jsonOnly(), Float("overload_x", sp.overload, 1).jsonOnly(),
			Float("goodput_pct", res.goodputPct(), 1).Named("goodput %"),
			Float("wasted_pct", res.wastedPct(), 1).Named("wasted %"),
			Int("refused_at_front", int(res.frontRefuse)).Named("front refused"))
	}
	r.Charts = append(r.Charts, Chart{Title: fmt.Sprintf("Two backends, both overloaded %gx: independent against consistent shedding", sp.overload),
		Kind: "bar", X: []string{"goodput %", "wasted %"}, YLabel: "% of user requests / of the backends' work",
		Series: []Series{
			Series{Name: chainIndependent + " shedding", Values: []float64{runs[0].goodputPct(), runs[0].wastedPct()}}.notJudgedIf(judged),
			Series{Name: chainConsistent + " shedding", Values: []float64{runs[1].goodputPct(), runs[1].wastedPct()}}.notJudgedIf(judged),
		}})
	ind, con := runs[0], runs[1]
	// Both backends admit about 1/overload of the requests: independently,
	// a request gets both with about 1/overload^2; consistently, up to
	// 1/overload.
	name := "consistent shedding: more goodput, less wasted work"
	switch {
	case !ind.sched.kept() || !con.sched.kept():
		r.notJudged(name, "%s", slices.MaxFunc([]schedule{ind.sched, con.sched}, func(a, b schedule) int {
			return boolCmp(a.kept(), b.kept())
		}).reason())
	case !quiet.quiet():
		r.notJudged(name, "%s", quiet.reason(""))
	default:
		r.check(con.goodputPct() >= 1.5*ind.goodputPct() && con.wastedPct() <= ind.wastedPct()/2, name,
			"goodput %.1f%% consistent, %.1f%% independent (want at least 1.5x); wasted %.1f%% and %.1f%% (want at most half)",
			con.goodputPct(), ind.goodputPct(), con.wastedPct(), ind.wastedPct())
	}
	r.note("At %gx, a request gets both backends with 1/%g^2 = %.0f%% independently, and up to 1/%g = %.0f%% consistently: the level starts at 0 and", sp.overload, sp.overload, 100/(sp.overload*sp.overload), sp.overload, 100/sp.overload)
	r.note("takes about a second to settle, and a backend without a queue still refuses the bursts above it (its shedder keeps them near 5%%).")
	r.note("shedding rows: a front calls two backends at once for every request (%d slots, %v of work each: %.0f rps), offered %gx that from %d users;",
		sp.slots, sp.work, sp.capacity(), sp.overload, sp.users)
	r.note("independent: each backend sheds whichever requests find it full; consistent: each backend's shedder sheds by cohort (ByCohort), and the front's")
	r.note("chain.Server refuses at its door the cohorts below the backends' levels. wasted = backend work for user requests that failed at the other backend.")
	return nil
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// shedOne runs one configuration: two backends, a front, the users.
func (p chainParams) shedOne(ctx context.Context, cfg string, seed int64) (*chainShedRun, error) {
	sp := p.shed
	consistent := cfg == chainConsistent
	res := &chainShedRun{}
	var servers []*server
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	var urls []string
	for b := range 2 {
		sh, err := shed.New(shed.Config{Name: fmt.Sprintf("backend%d", b), Limit: sp.slots, ByCohort: consistent})
		if err != nil {
			return nil, err
		}
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Exponential service times, each backend its own: two
			// backends that served in lockstep would be full at the
			// same moments and shed the same requests by chance.
			d := time.Duration(min(rand.ExpFloat64(), 5) * float64(sp.work))
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-timer.C:
				_, _ = w.Write([]byte("ok"))
			case <-r.Context().Done():
			}
		})
		h = sh.Middleware(h)
		if consistent {
			cs, err := chain.New(chain.Config{Name: fmt.Sprintf("backend%d", b), Admission: sh.AdmissionLevel})
			if err != nil {
				return nil, err
			}
			h = cs.Middleware(h)
		}
		s, err := serve(h)
		if err != nil {
			return nil, err
		}
		servers = append(servers, s)
		urls = append(urls, s.URL+"/")
	}
	// The front: no capacity limit of its own, one client per backend
	// without retries (the overload is the point), and for consistent
	// shedding a chain.Server that gives each user its cohort and refuses
	// below the backends' levels.
	var trs []*guardhttp.Transport
	var clients []*http.Client
	for b := range 2 {
		tr := mustTransport(newBaseTransport(true), guardhttp.Config{Name: fmt.Sprintf("backend%d", b), Breakers: noBreakers(),
			Retry: guardrail.Retry{MaxAttempts: 1}})
		trs = append(trs, tr)
		clients = append(clients, &http.Client{Transport: tr})
	}
	var front http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ok [2]bool
		var wg sync.WaitGroup
		for b := range 2 {
			wg.Go(func() {
				_, err := get(r.Context(), clients[b], urls[b])
				ok[b] = err == nil
			})
		}
		wg.Wait()
		for b := range 2 {
			if ok[b] {
				atomic.AddInt64(&res.worked, 1)
				if !ok[1-b] {
					atomic.AddInt64(&res.wasted, 1)
				}
			}
		}
		if !ok[0] || !ok[1] {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	if consistent {
		cs, err := chain.New(chain.Config{
			Name: "front",
			Key:  func(r *http.Request) string { return r.Header.Get("X-User") },
			Admission: func() int {
				return max(trs[0].AdmissionLevel(), trs[1].AdmissionLevel())
			},
		})
		if err != nil {
			return nil, err
		}
		front = countRefusals(cs.Middleware(front), &res.frontRefuse)
	}
	fs, err := serve(front)
	if err != nil {
		return nil, err
	}
	servers = append(servers, fs)

	rps := sp.overload * sp.capacity()
	n := int(rps * sp.dur.Seconds())
	user := newHTTPClient(true)
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(rng.IntN(sp.users))
	}
	lags := make([]time.Duration, 0, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for u := range n {
		at := t0.Add(time.Duration(float64(u) / rps * float64(time.Second)))
		if err := sleepUntil(ctx, at); err != nil {
			wg.Wait()
			return nil, err
		}
		lags = append(lags, max(0, time.Since(at)))
		res.offered++
		key := keys[u]
		wg.Go(func() {
			uctx, cancel := context.WithTimeout(ctx, p.deadline)
			defer cancel()
			req, err := http.NewRequestWithContext(uctx, http.MethodGet, fs.URL+"/", nil)
			if err != nil {
				return
			}
			req.Header.Set("X-User", key)
			resp, err := user.Do(req)
			if err != nil {
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				atomic.AddInt64(&res.ok, 1)
			}
		})
	}
	elapsed := time.Since(t0)
	wg.Wait()
	slices.Sort(lags)
	res.sched = schedule{run: cfg + " shedding", rate: float64(n) / max(elapsed.Seconds(), 1e-9), want: rps,
		lagP99: lags[min(len(lags)-1, len(lags)*99/100)], maxLag: 50 * time.Millisecond}
	return res, ctx.Err()
}

// countRefusals counts the answers next marks not processed: the front's
// refusals at its door.
func countRefusals(next http.Handler, n *int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&refusalCounter{ResponseWriter: w, n: n}, r)
	})
}

type refusalCounter struct {
	http.ResponseWriter
	n *int64
}

func (w *refusalCounter) WriteHeader(code int) {
	if w.Header().Get(chain.HeaderNotProcessed) != "" {
		atomic.AddInt64(w.n, 1)
	}
	w.ResponseWriter.WriteHeader(code)
}
