package lab

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/fallback"
	"github.com/guardrail-go/guardrail/guardhttp"
)

type deadlineParams struct {
	a, b, c     time.Duration // how long each service works
	perA, perBC time.Duration // per-call budgets
	budget      time.Duration // the API's deadline for its calls
	slo         time.Duration // the user's timeout
	disconnect  time.Duration // when the second user gives up
}

func deadlineExp() Experiment {
	return bound(Experiment{
		Name:    "deadline",
		Light:   true,
		Summary: "a 1.9 s deadline propagated to A, then B and optional C: a partial answer in time, and a disconnect stopping everything",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := deadlineParams{a: 700 * time.Millisecond, b: 600 * time.Millisecond, c: 3 * time.Second,
				perA: 800 * time.Millisecond, perBC: 900 * time.Millisecond, budget: 1900 * time.Millisecond,
				slo: 2 * time.Second, disconnect: 300 * time.Millisecond}
			fs.DurationVar(&p.a, "a", p.a, "service A's work (required, called first)")
			fs.DurationVar(&p.b, "b", p.b, "service B's work (required, in parallel with C)")
			fs.DurationVar(&p.c, "c", p.c, "service C's work (optional)")
			fs.DurationVar(&p.perA, "per-a", p.perA, "per-call budget for A")
			fs.DurationVar(&p.perBC, "per-bc", p.perBC, "per-call budget for B and C")
			fs.DurationVar(&p.budget, "budget", p.budget, "the API's deadline for its downstream calls, propagated in headers")
			fs.DurationVar(&p.slo, "slo", p.slo, "the user's timeout (the API's SLO)")
			fs.DurationVar(&p.disconnect, "disconnect", p.disconnect, "when the second user disconnects")
			return &p
		},
	})
}

// worker is a downstream service that works for d unless its caller's
// deadline or disconnect stops it first; it records which.
type worker struct {
	name string
	d    time.Duration
	mu   sync.Mutex
	log  []string
	done chan struct{} // one value per request finished
}

func (w *worker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	t := time.NewTimer(w.d)
	defer t.Stop()
	defer func() { w.done <- struct{}{} }()
	select {
	case <-t.C:
		w.record(fmt.Sprintf("%s: done in %dms", w.name, time.Since(start).Milliseconds()))
		_, _ = rw.Write([]byte(`"ok"`))
	case <-r.Context().Done():
		w.record(fmt.Sprintf("%s: aborted after %dms, caller gave up (%v)", w.name, time.Since(start).Milliseconds(), context.Cause(r.Context())))
		// Answer within the caller's deadline (the middleware kept a
		// reserve for this) rather than leave it waiting.
		http.Error(rw, "deadline exceeded", http.StatusGatewayTimeout)
	}
}

func (w *worker) record(s string) {
	w.mu.Lock()
	w.log = append(w.log, s)
	w.mu.Unlock()
}

func (w *worker) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.log
	w.log = nil
	return out
}

// checkFlags reports every flag the experiment cannot run with. Each is one
// request's time; zero work is allowed, a zero budget or timeout is not
// (guardhttp would read a zero attempt timeout as its default).
func (p deadlineParams) checkFlags() error {
	var c flagCheck
	for _, f := range []struct {
		name string
		v    time.Duration
		s    span[time.Duration]
	}{
		{"a", p.a, closed(0, maxWait)},
		{"b", p.b, closed(0, maxWait)},
		{"c", p.c, closed(0, maxWait)},
		{"per-a", p.perA, above(0, maxWait)},
		{"per-bc", p.perBC, above(0, maxWait)},
		{"budget", p.budget, above(0, maxWait)},
		{"slo", p.slo, above(0, maxWait)},
		{"disconnect", p.disconnect, above(0, maxWait)},
	} {
		within(&c, f.name, f.v, f.s)
	}
	return c.err()
}

func (p deadlineParams) run(ctx context.Context, env *Env) (*Result, error) {
	r := &Result{Experiment: "deadline", Title: fmt.Sprintf("API with a %v SLO: A, then B || optional C, under a %v deadline sent in headers", p.slo, p.budget)}
	workers := map[string]*worker{}
	urls := map[string]string{}
	for name, d := range map[string]time.Duration{"A": p.a, "B": p.b, "C": p.c} {
		w := &worker{name: name, d: d, done: make(chan struct{}, 16)}
		dl, err := deadline.New(deadline.Config{Max: p.slo})
		if err != nil {
			return nil, err
		}
		s, err := serve(dl.Middleware(w))
		if err != nil {
			return nil, err
		}
		defer s.Close()
		workers[name], urls[name] = w, s.URL
	}
	// guardhttp gives each call min(per-call budget, time left) and sends
	// what is left in X-Request-Timeout and X-Request-Deadline.
	clientA := guarded(true, guardhttp.Config{Name: "A", Retry: guardrail.Retry{MaxAttempts: 1, AttemptTimeout: p.perA}})
	clientBC := guarded(true, guardhttp.Config{Name: "B-C", Retry: guardrail.Retry{MaxAttempts: 1, AttemptTimeout: p.perBC}})
	call := func(c *http.Client, url string) func(context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			if _, err := get(ctx, c, url); err != nil {
				return "", err
			}
			return "ok", nil
		}
	}
	client := newHTTPClient(true) // the users'

	type outcome struct {
		took    time.Duration
		err     error
		partial bool
		body    map[string]any
	}
	handlerDone := make(chan outcome, 4)
	api, err := serve(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		dctx, cancel := context.WithDeadline(r.Context(), t0.Add(p.budget))
		defer cancel()
		body := map[string]any{}
		var out outcome
		defer func() { out.took = time.Since(t0); handlerDone <- out }()

		ga := fallback.NewFanout(dctx)
		a := fallback.Required(ga, "A", p.perA, call(clientA, urls["A"]))
		if out.err = ga.Wait(); out.err != nil {
			http.Error(rw, out.err.Error(), http.StatusBadGateway)
			return
		}
		body["A"], _ = a.Value()
		g := fallback.NewFanout(dctx)
		b := fallback.Required(g, "B", p.perBC, call(clientBC, urls["B"]))
		c := fallback.Optional(g, "C", p.perBC, call(clientBC, urls["C"]))
		if out.err = g.Wait(); out.err != nil {
			http.Error(rw, out.err.Error(), http.StatusBadGateway)
			return
		}
		body["B"], _ = b.Value()
		if v, ok := c.Value(); ok {
			body["C"] = v
		} else {
			body["C"] = nil
			body["partial"] = true
			fallback.MarkPartial(rw.Header())
			out.partial = true
		}
		body["took"] = time.Since(t0).Milliseconds()
		out.body = body
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(body)
	}))
	if err != nil {
		return nil, err
	}
	defer api.Close()

	// 1. A user with the SLO as timeout: the answer is partial, in time.
	env.Progress("deadline: the partial answer")
	uctx, cancel := context.WithTimeout(ctx, p.slo)
	probe := probeQuiet(ctx)
	start := time.Now()
	req, _ := http.NewRequestWithContext(uctx, http.MethodGet, api.URL, nil)
	resp, err := client.Do(req)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("the user's request failed: %w", err)
	}
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	took := time.Since(start)
	late := probe.stop()
	h := <-handlerDone
	for _, w := range workers { // each served one request; wait for its log
		select {
		case <-w.done:
		case <-time.After(p.slo):
		}
	}
	bj, _ := json.Marshal(body)
	r.add("partial answer", Ms("took_ms", took).Named("took"), Bool("partial", h.partial), Int("status", resp.StatusCode),
		Str("result", string(bj)).jsonOnly(), Ms("timer_lateness_p99_ms", late.p99).jsonOnly())
	r.note("result: %s", bj)
	var logs []string
	for _, n := range []string{"A", "B", "C"} {
		logs = append(logs, workers[n].take()...)
	}
	for _, l := range logs {
		r.note("%s", l)
	}
	cAborted := len(logs) == 3 && containsPrefix(logs, "C: aborted")
	p.partialChecks(r, late, took, h.partial, resp.StatusCode, cAborted)

	// 2. A user who disconnects: the handler and A stop.
	env.Progress("deadline: a user disconnecting at %v", p.disconnect)
	uctx, cancel = context.WithTimeout(ctx, p.disconnect)
	probe = probeQuiet(ctx)
	start = time.Now()
	req, _ = http.NewRequestWithContext(uctx, http.MethodGet, api.URL, nil)
	_, err = client.Do(req)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("the disconnecting user's request: %v, want its own timeout", err)
	}
	h = <-handlerDone
	stopped := time.Since(start)
	late = probe.stop()
	select {
	case <-workers["A"].done:
	case <-time.After(p.slo):
	}
	aLog := workers["A"].take()
	r.add("client disconnect", Ms("disconnect_ms", p.disconnect).Named("disconnect"), Ms("stopped_after_ms", stopped).Named("handler_stopped_after"),
		Bool("downstream_stopped", containsPrefix(aLog, "A: aborted")))
	r.note("client disconnect -> handler stopped after %dms: %v", stopped.Milliseconds(), h.err)
	for _, l := range aLog {
		r.note("%s", l)
	}
	r.timed((&timing{}).needQuiet("client disconnect", late), stopped < p.disconnect+200*time.Millisecond, "disconnect stops the handler",
		"handler stopped %v after the request began (disconnect at %v)", stopped.Round(time.Millisecond), p.disconnect)
	r.check(containsPrefix(aLog, "A: aborted"), "disconnect stops A", "A's log: %v", aLog)
	return r, nil
}

// partialChecks judges the partial answer: its times need a machine quiet
// enough to time the request (late, measured alongside it); C's abort is
// what its server saw, judged whatever the machine did.
func (p deadlineParams) partialChecks(r *Result, late lateness, took time.Duration, partial bool, status int, cAborted bool) {
	pre := (&timing{}).needQuiet("partial answer", late)
	expect := p.a + min(p.perBC, p.budget-p.a)
	r.timed(pre, took < p.slo && partial && status == 200, "partial in time", "answered %v (SLO %v), partial=%v", took.Round(time.Millisecond), p.slo, partial)
	r.timed(pre, took >= expect-50*time.Millisecond && took < expect+250*time.Millisecond, "optional C cut at its budget",
		"answered %v, want about A + min(per-call, time left) = %v (-50ms, +250ms)", took.Round(time.Millisecond), expect)
	r.check(cAborted, "C stopped, not abandoned", "C's server saw its caller give up: %v", cAborted)
}

func containsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
			return true
		}
	}
	return false
}
