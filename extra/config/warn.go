package config

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/throttle"
)

// longTimeout is the timeout above which the checks warn: a caller kept
// waiting longer than this holds a goroutine, a connection and its own
// caller's patience for a dependency that has, in all likelihood, failed.
const longTimeout = 10 * time.Second

func (c *checkedFile) dependency(name string) *resolvedDep {
	return c.byName[name]
}

// checkCalls reports names in calls lists that name no dependency, and
// cycles, which no call chain can have.
func (c *checkedFile) checkCalls() []Diagnostic {
	var diags []Diagnostic
	check := func(path string, calls []string) {
		for i, n := range calls {
			if c.dependency(n) == nil {
				diags = append(diags, c.diag(severityError, fmt.Sprintf("%s.calls[%d]", path, i), "names %q, which is not a dependency of this file; want one of the names under dependencies", n))
			}
		}
	}
	for _, d := range c.Dependencies {
		check("dependencies."+d.Name, d.Calls)
	}
	for _, s := range c.Servers {
		check("servers."+s.Name, s.Calls)
	}
	// Cycles.
	state := map[string]int{}
	var visit func(n string, stack []string) bool
	visit = func(n string, stack []string) bool {
		switch state[n] {
		case 1:
			diags = append(diags, c.diag(severityError, "dependencies."+n+".calls", "makes a cycle (%s); a call chain cannot call back into itself", strings.Join(append(stack, n), " -> ")))
			return false
		case 2:
			return true
		}
		state[n] = 1
		if d := c.dependency(n); d != nil {
			for _, m := range d.Calls {
				if !visit(m, append(stack, n)) {
					return false
				}
			}
		}
		state[n] = 2
		return true
	}
	for _, d := range c.Dependencies {
		if !visit(d.Name, nil) {
			break
		}
	}
	return diags
}

// attempts returns the effective attempts of d.
func (d *resolvedDep) attempts() int {
	switch n := d.Retry.MaxAttempts; {
	case n > 0:
		return n
	case n < 0:
		return 1 // invalid, and reported so; no warning builds on it
	}
	return guardrail.DefaultMaxAttempts
}

// strategy returns the backoff d uses.
func (d *resolvedDep) strategy() backoff.Strategy {
	s := d.Retry.Backoff
	if s == nil {
		s = backoff.Default()
	}
	return s
}

// worstCase returns the longest a call to d may take from its own
// settings: every attempt to its timeout, and the longest backoff between
// them; zero when attempts are unbounded.
func (d *resolvedDep) worstCase() time.Duration {
	at := d.Retry.AttemptTimeout
	if at <= 0 {
		return 0
	}
	n := d.attempts()
	total := satMul(at, n)
	s := d.strategy()
	var prev time.Duration
	// Backoff reaches its cap within 64 retries; the rest wait the cap.
	for r := range min(n-1, 64) {
		prev = s.Delay(r, prev, 1-1e-9)
		total = satAdd(total, prev)
	}
	if n-1 > 64 {
		total = satAdd(total, satMul(prev, n-1-64))
	}
	return total
}

// satMul and satAdd saturate instead of overflowing.
func satMul(d time.Duration, n int) time.Duration {
	if d > 0 && n > 0 && d > math.MaxInt64/time.Duration(n) {
		return math.MaxInt64
	}
	return d * time.Duration(n)
}

func satAdd(a, b time.Duration) time.Duration {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// timeout returns the time d's callers may wait for it: its deadline, else
// its worst case; zero when unknown.
func (d *resolvedDep) timeout() time.Duration {
	if d.Deadline > 0 {
		return d.Deadline
	}
	return d.worstCase()
}

var idempotentMethods = map[string]bool{http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true, http.MethodTrace: true, http.MethodPut: true, http.MethodDelete: true}

func (c *checkedFile) warn(path, format string, args ...any) Diagnostic {
	return c.diag(severityWarning, path, format, args...)
}

func (c *checkedFile) warnings() []Diagnostic {
	var w []Diagnostic
	for _, d := range c.Dependencies {
		name := d.Name
		base := "dependencies." + name
		s := &d.Settings
		n := d.attempts()
		// Retries on routes that are not idempotent.
		if n > 1 && d.Kind == kindHTTP && !val(s.IdempotencyKeys) {
			for i, rt := range c.File.Dependencies[name].Routes {
				if rt == nil || rt.Method == nil || rt.Path == nil {
					continue
				}
				idem := idempotentMethods[strings.ToUpper(*rt.Method)]
				if rt.Idempotent != nil {
					idem = *rt.Idempotent
				}
				if !idem {
					w = append(w, c.warn(fmt.Sprintf("%s.routes[%d]", base, i), "%s %s is not idempotent and idempotency_keys is off, yet max_attempts is %d: such a request is retried only when it was never sent, and one that timed out ends with an unknown outcome; set idempotency_keys: true if the server deduplicates by Idempotency-Key, or max_attempts: 1",
						*rt.Method, *rt.Path, n))
				}
			}
		}
		if n > 1 && d.Kind == kindGRPC {
			w = append(w, c.grpcRetryWarnings(d, n)...)
		}
		if n > 1 && d.Kind == kindPolicy && s.MaxAttempts != nil && !val(s.Idempotent) {
			w = append(w, c.warn(c.where(name, "max_attempts"), "is %d but idempotent is not true: Do retries only failures that say nothing was sent, and an attempt that timed out ends with ErrOutcomeUnknown; set idempotent: true if the operation carries an idempotency key or is a read", n))
		}
		// No retry budget.
		if d.Budget == nil && n > 1 {
			w = append(w, c.warn(c.where(name, "retry_budget.unlimited"), "no retry budget with max_attempts %d: while %s is down every call is sent %d times, multiplying the load on a dependency that is already failing; keep a budget (ratio 0.1 holds retries to a tenth of the calls)", n, name, n))
		}
		w = append(w, c.hedgeWarnings(d)...)
		// A breaker with no minimum.
		if b := s.Breaker; b != nil && val(b.MinRequests) == 1 && val(b.Mode) != "disabled" {
			w = append(w, c.warn(c.where(name, "breaker.min_requests"), "is 1: at low traffic one early failure opens the breaker for %v; keep a minimum of calls (the default is %d) so that the rate means something", orDur(val(b.OpenFor), breaker.DefaultConfig().OpenFor), breaker.DefaultMinRequests))
		}
		// Attempts that cannot fit the deadline.
		if wc := d.worstCase(); d.Deadline > 0 && wc > d.Deadline {
			w = append(w, c.warn(c.where(name, "deadline"), "is %v, but %d attempts of attempt_timeout %v plus up to %v of backoff take up to %v: the last attempts are cut short or never made; lower max_attempts or attempt_timeout, or raise the deadline",
				d.Deadline, n, val(s.AttemptTimeout), (wc-time.Duration(n)*val(s.AttemptTimeout)).Round(time.Millisecond), wc.Round(time.Millisecond)))
		}
		// Long timeouts.
		for _, k := range []struct {
			key string
			v   *time.Duration
		}{{"attempt_timeout", s.AttemptTimeout}, {"deadline", s.Deadline}, {"connect_timeout", s.ConnectTimeout},
			{"tls_handshake_timeout", s.TLSHandshakeTimeout}, {"write_timeout", s.WriteTimeout},
			{"response_header_timeout", s.ResponseHeaderTimeout}, {"body_idle_timeout", s.BodyIdleTimeout}} {
			if k.v != nil && *k.v > longTimeout {
				w = append(w, c.warn(c.where(name, k.key), "is %v, over %v: a caller waits that long on a dependency that has most likely failed, holding a goroutine and a connection, and its own callers have usually given up by then", *k.v, longTimeout))
			}
		}
	}
	for _, s := range c.Servers {
		if s.Deadline != nil && s.Deadline.Max > longTimeout {
			w = append(w, c.warn("servers."+s.Name+".deadline.max", "is %v, over %v: a request may hold the server's resources that long, and its caller has usually given up by then", s.Deadline.Max, longTimeout))
		}
	}
	w = append(w, c.chainWarnings()...)
	return w
}

// hedgedMethods are the methods guardhttp hedges: the idempotent ones
// whose copies in flight at once are harmless by RFC 9110. A POST or PATCH
// is not hedged even with an idempotency key, since two copies in flight
// at once meet the server's "same key in flight" refusal.
var hedgedMethods = map[string]bool{http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true, http.MethodTrace: true, http.MethodPut: true, http.MethodDelete: true}

// maxHedgesWarning is the max_hedges above which the checks warn.
const maxHedgesWarning = 2

// minThrottleK is the throttle multiplier below which the checks warn.
const minThrottleK = 1.5

// hedgeWarnings warns about hedging that cannot happen, that duplicates
// side effects or that nothing stops under overload, and about a throttle
// that rejects the traffic of a healthy dependency.
func (c *checkedFile) hedgeWarnings(d *resolvedDep) []Diagnostic {
	var w []Diagnostic
	name, s := d.Name, &d.Settings
	if h := d.Hedge; h != nil {
		at := c.where(name, "hedge")
		switch d.Kind {
		case kindPolicy:
			if !val(s.Idempotent) {
				w = append(w, c.warn(at, "is set but idempotent is not true: only idempotent calls are hedged, so none of %s's calls is, unless the code marks one idempotent (guardrail.Call.Idempotent), which sends it twice at once; set idempotent: true if repeating the operation is harmless, or drop hedge", name))
			}
		case kindHTTP:
			routes := c.File.Dependencies[name].Routes
			hedged := 0
			for i, rt := range routes {
				if rt == nil || rt.Method == nil || rt.Path == nil || !hedgedMethods[strings.ToUpper(*rt.Method)] {
					continue
				}
				hedged++
				if rt.Idempotent != nil && !*rt.Idempotent {
					w = append(w, c.warn(fmt.Sprintf("dependencies.%s.routes[%d]", name, i), "%s %s says idempotent: false, yet %s hedges: guardhttp hedges a %s by its method, so a slow one is sent again while the first is in flight and its side effect happens twice; give the route a dependency of its own without hedge",
						*rt.Method, *rt.Path, name, strings.ToUpper(*rt.Method)))
				}
			}
			if len(routes) > 0 && hedged == 0 {
				w = append(w, c.warn(at, "is set but no route of %s is hedged: guardhttp hedges only GET, HEAD, OPTIONS, PUT and DELETE requests, not a POST or PATCH even with an idempotency key (two copies in flight at once meet the server's refusal of a key in flight, not a replay); drop hedge", name))
			}
		case kindGRPC:
			methods := d.GRPC.IdempotentMethods
			if len(methods) == 0 {
				w = append(w, c.warn(at, "is set but idempotent_methods lists no method: guardgrpc hedges only the unary calls of the methods listed there, so none of %s's calls is; list the methods that are safe to send twice at once, or drop hedge", name))
				break
			}
			routes := c.File.Dependencies[name].Routes
			hedged := 0
			for i, rt := range routes {
				if rt == nil || rt.Method == nil || !idempotentMethod(methods, *rt.Method) {
					continue
				}
				hedged++
				if rt.Idempotent != nil && !*rt.Idempotent {
					w = append(w, c.warn(fmt.Sprintf("dependencies.%s.routes[%d]", name, i), "%s says idempotent: false, yet idempotent_methods covers it and %s hedges: a slow call of it is sent again while the first is in flight, and its side effect happens twice; list the other methods of its service by name instead",
						*rt.Method, name))
				}
			}
			if len(routes) > 0 && hedged == 0 {
				w = append(w, c.warn(at, "is set but no route of %s is hedged: guardgrpc hedges only the methods idempotent_methods lists, not a call that carries an idempotency-key (two copies in flight with one key meet the server's refusal of a key in flight, not a replay); drop hedge", name))
			}
		}
		if d.Budget == nil {
			w = append(w, c.warn(c.where(name, "retry_budget.unlimited"), "no retry budget, yet hedge is set: each hedge spends a budget token and hedging stops while the budget is below half full, which is what holds hedges back when %s slows down under load before it refuses anything; without a budget nothing does, and every slow call adds its hedges to the load; keep a budget", name))
		}
		if h.MaxHedges > maxHedgesWarning {
			w = append(w, c.warn(c.where(name, "hedge.max_hedges"), "is %d: a slow moment sends up to %d copies of each call, multiplying the load on %s exactly when it is slow, while hedges past the second cut little more of the tail; keep 1 or 2", h.MaxHedges, h.MaxHedges+1, name))
		}
	}
	if t := d.Throttle; t != nil && t.K >= 1 && t.K < minThrottleK { // below 1 is an error
		w = append(w, c.warn(c.where(name, "throttle.k"), "is %s, below %s: the throttle rejects requests locally as soon as fewer than %.0f %% of them are accepted, so a few failures of a healthy dependency, or a quiet window that holds few requests, turn real traffic away; keep the default %s, which rejects only once fewer than half are accepted",
			fmtFloat(t.K), fmtFloat(minThrottleK), 100/t.K, fmtFloat(throttle.DefaultK)))
	}
	return w
}

// grpcRetryWarnings warns about the retries of a gRPC dependency's
// methods that are not idempotent: those of its routes, or when it lists
// none, all of them if idempotent_methods is empty.
func (c *checkedFile) grpcRetryWarnings(d *resolvedDep, n int) []Diagnostic {
	var w []Diagnostic
	base := "dependencies." + d.Name
	routes := c.File.Dependencies[d.Name].Routes
	for i, rt := range routes {
		if rt == nil || rt.Method == nil {
			continue
		}
		idem := idempotentMethod(d.GRPC.IdempotentMethods, *rt.Method)
		if rt.Idempotent != nil {
			idem = *rt.Idempotent
		}
		if !idem {
			w = append(w, c.warn(fmt.Sprintf("%s.routes[%d]", base, i), "%s is not in idempotent_methods, yet max_attempts is %d: a call of it is retried only when it never reached the server, and one that timed out ends with an unknown outcome; list it in idempotent_methods if repeating it is harmless, send an idempotency-key with it (and say idempotent: true here), or set max_attempts: 1",
				*rt.Method, n))
		}
	}
	if len(routes) == 0 && len(d.GRPC.IdempotentMethods) == 0 && d.Settings.MaxAttempts != nil {
		w = append(w, c.warn(c.where(d.Name, "max_attempts"), "is %d but idempotent_methods lists no method: guardgrpc retries a call only when it never reached the server (or carries an idempotency-key), and one that timed out ends with an unknown outcome; list the methods that are safe to repeat in idempotent_methods",
			n))
	}
	return w
}

func orDur(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// chainWarnings compares each caller's timeout with its callees', and
// counts the tiers that retry along every chain.
func (c *checkedFile) chainWarnings() []Diagnostic {
	var w []Diagnostic
	type caller struct {
		path    string // the calls key
		name    string
		timeout time.Duration
		retries bool
		attempt int
	}
	var callers []caller
	for _, s := range c.Servers {
		t := time.Duration(0)
		if s.Deadline != nil && s.Deadline.Max > 0 {
			t = s.Deadline.Max
		}
		callers = append(callers, caller{"servers." + s.Name, "server " + s.Name, t, false, 1})
	}
	for _, d := range c.Dependencies {
		callers = append(callers, caller{"dependencies." + d.Name, d.Name, d.timeout(), d.attempts() > 1, d.attempts()})
	}
	for _, cl := range callers {
		var calls []string
		if strings.HasPrefix(cl.path, "servers.") {
			calls = c.File.Servers[strings.TrimPrefix(cl.path, "servers.")].Calls
		} else {
			calls = c.dependency(strings.TrimPrefix(cl.path, "dependencies.")).Calls
		}
		for i, n := range calls {
			callee := c.dependency(n)
			if callee == nil {
				continue
			}
			if ct := callee.timeout(); cl.timeout > 0 && ct > cl.timeout {
				w = append(w, c.warn(fmt.Sprintf("%s.calls[%d]", cl.path, i), "%s may take up to %v, longer than its caller %s waits (%v): the caller gives up while %s still works, and the work is wasted; give %s a shorter deadline than its caller's",
					n, ct, cl.name, cl.timeout, n, n))
			}
		}
	}
	// Retries at more than one tier: walk every chain from its roots.
	var walk func(name string, chain []string, product int, tiers []string, seen map[string]bool)
	reported := map[string]bool{}
	steps := 0 // bounds the walk: a file with many diamonds has exponentially many chains
	walk = func(name string, chain []string, product int, tiers []string, seen map[string]bool) {
		d := c.dependency(name)
		if steps++; d == nil || seen[name] || steps > 10000 || len(chain) > 64 {
			return
		}
		seen[name] = true
		defer delete(seen, name)
		chain = append(chain, name)
		if n := d.attempts(); n > 1 {
			product = min(product*n, 1<<30)
			tiers = append(tiers, fmt.Sprintf("%s (%d)", name, n))
		}
		if len(tiers) == 2 && !reported[name] { // the first tier that multiplies; deeper ones repeat it
			reported[name] = true
			w = append(w, c.warn(c.where(name, "max_attempts"), "retries at %d tiers of the chain %s: %s; a failure of %s can cost up to %d attempts for one call at the top, and retries multiply at each tier; retry at one tier only (usually the one nearest the user) and set max_attempts: 1 at the others",
				len(tiers), strings.Join(chain, " -> "), strings.Join(tiers, ", "), name, product))
		}
		for _, m := range d.Calls {
			walk(m, chain, product, tiers, seen)
		}
	}
	called := map[string]bool{}
	for _, d := range c.Dependencies {
		for _, m := range d.Calls {
			called[m] = true
		}
	}
	for _, d := range c.Dependencies {
		if !called[d.Name] {
			walk(d.Name, nil, 1, nil, map[string]bool{})
		}
	}
	return w
}
