package config

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/admin"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/throttle"
)

// AdminConfig configures the admin endpoint.
// It is a plain value.
type AdminConfig struct {
	// Authorize decides whether a request may change state (force a
	// breaker open, close or reset it): a nil error lets it. It is
	// required unless ReadOnly is set: there is no default that leaves
	// writes open.
	Authorize func(*http.Request) error
	// AuthorizeRead, if set, guards the listing too. Nil lets anyone who
	// reaches the endpoint read it: keep it on loopback or behind auth.
	AuthorizeRead func(*http.Request) error
	// ReadOnly serves the listing only; every write is refused with 403.
	ReadOnly bool
	// Logger receives one line per write, with its reason, and the error
	// of every refused authorisation, which the caller is not told. Nil
	// means the Registry's logger.
	Logger *slog.Logger
	// Hosts lists the names, besides loopback names and literal IP
	// addresses, that requests may carry in their Host header, as
	// admin.Config.Hosts: "ops.example.com" on any port,
	// "ops.example.com:9901" on that port only. Nil means none: the
	// endpoint answers http://127.0.0.1:9901/ and http://localhost:9901/,
	// and refuses a request for any other name with 403, which defeats
	// DNS rebinding.
	Hosts []string
}

// errNoAuthorize is the error of NewAdmin for a Config that would leave
// writes open.
var errNoAuthorize = errors.New("AdminConfig.Authorize is nil and ReadOnly is false; want an Authorize hook, or ReadOnly: true, since the admin endpoint can force breakers open")

// forbidden is what a caller whose authorisation failed is told: the
// hook's error may say what a valid credential looks like, so it goes to
// the log only.
const forbidden = "forbidden"

// maxBodyBytes bounds the JSON body of an admin action.
const maxBodyBytes = 4 << 10

// maxReasonLength bounds the reason of an admin action, which goes to the
// log.
const maxReasonLength = 500

// Admin is the admin endpoint of a Registry, an http.Handler to mount
// where operators reach it. It is safe for concurrent use.
type Admin struct {
	reg *Registry
	cfg AdminConfig
	log *slog.Logger
	h   http.Handler // the mux behind the guard
}

// NewAdmin returns the admin endpoint of reg. It lists every breaker,
// budget, bulkhead and shedder with its state and settings (GET /), and
// forces a breaker open, closed or reset (POST
// /breakers/{dependency}/{open|close|reset}?key=KEY&reason=TEXT, where KEY
// is the host of an HTTP dependency or the failure domain of a gRPC one:
// its target, or its target and full method name; key and reason may come
// in a JSON body instead). A reason of at most 500 bytes is required, and
// logged with the action. An action applies to breakers that exist: an
// unknown dependency or key is answered 404 with what exists, and the
// endpoint never creates a breaker.
//
// Every request passes an admin.Guard first, which refuses a Host outside
// cfg.Hosts and the loopback names (403), a cross-origin write (403) and a
// write whose body is not JSON (415), so that a web page cannot drive the
// endpoint through an operator's browser.
//
// The error Is ErrInvalidConfig, and names every invalid field, when cfg
// has no Authorize and is not ReadOnly, or an entry of cfg.Hosts is not a
// host name or host:port.
func NewAdmin(reg *Registry, cfg AdminConfig) (*Admin, error) {
	var errs []error
	if cfg.Authorize == nil && !cfg.ReadOnly {
		errs = append(errs, errNoAuthorize)
	}
	guard, err := admin.New(admin.Config{Hosts: cfg.Hosts})
	if err != nil {
		errs = append(errs, hostsError(cfg.Hosts))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	a := &Admin{reg: reg, cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = reg.log
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", a.list)
	mux.HandleFunc("POST /breakers/{dependency}/{action}", a.act)
	a.h = guard.Middleware(mux)
	return a, nil
}

// hostsError names each entry of hosts that admin.New refuses, under the
// field name of AdminConfig.
func hostsError(hosts []string) error {
	var errs []error
	for i, h := range hosts {
		if _, err := admin.New(admin.Config{Hosts: []string{h}}); err != nil {
			errs = append(errs, fmt.Errorf("AdminConfig.Hosts[%d] is %q; want a host name or host:port", i, h))
		}
	}
	return errors.Join(errs...)
}

// ServeHTTP serves the endpoint.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.h.ServeHTTP(w, r) }

// breakerState is one breaker in the listing.
// It is a plain value.
type breakerState struct {
	Dependency  string         `json:"dependency"`
	Key         string         `json:"key,omitempty"` // the host of an HTTP dependency; the target (or target and method) of a gRPC one
	State       string         `json:"state"`
	Forced      bool           `json:"forced"`
	Calls       int            `json:"calls"`
	Failures    int            `json:"failures"`
	FailureRate float64        `json:"failure_rate"`
	Opens       int            `json:"opens"`
	OpenUntil   time.Time      `json:"open_until,omitzero"`
	Settings    map[string]any `json:"settings"`
}

// budgetState is one retry budget in the listing.
// It is a plain value.
type budgetState struct {
	Dependency string  `json:"dependency"`
	Unlimited  bool    `json:"unlimited"`
	Tokens     float64 `json:"tokens"`
	Max        float64 `json:"max"`
	// Settings are the budget's configuration with defaults applied.
	Settings map[string]any `json:"settings,omitempty"`
}

// bulkheadState is one bulkhead in the listing.
// It is a plain value.
type bulkheadState struct {
	Dependency string `json:"dependency"`
	InFlight   int    `json:"in_flight"`
	Waiting    int    `json:"waiting"`
	Limit      int    `json:"limit"`
}

// throttlerState is one dependency's adaptive throttle in the listing:
// what its window holds now and the probability with which it rejects a
// request locally.
// It is a plain value.
type throttlerState struct {
	Dependency string `json:"dependency"`
	// Requests and Accepts are the requests attempted (rejected ones
	// included) and those the dependency accepted, in the window now.
	Requests          int64   `json:"requests"`
	Accepts           int64   `json:"accepts"`
	RejectProbability float64 `json:"reject_probability"`
	// Settings are the throttle's configuration with defaults applied.
	Settings map[string]any `json:"settings"`
}

// hedgeState is one dependency's hedging in the listing. The core keeps
// its state (the adaptive delay, a pause after an overload answer) to
// itself, so the listing holds the settings alone; the events
// event.Hedge and event.HedgeRefused say what hedging does.
// It is a plain value.
type hedgeState struct {
	Dependency string `json:"dependency"`
	// Settings are the hedge configuration with defaults applied.
	Settings map[string]any `json:"settings"`
}

// shedderState is one shedder in the listing.
// It is a plain value.
type shedderState struct {
	Server   string            `json:"server"`
	InFlight int               `json:"in_flight"`
	Limit    int               `json:"limit"`
	Queued   int               `json:"queued"`
	Admitted uint64            `json:"admitted"`
	Shed     uint64            `json:"shed"`
	ByReason map[string]uint64 `json:"shed_by_reason"`
	MinRTT   string            `json:"min_rtt,omitempty"`
	// Settings are the shedder's configuration as the file sets it; a
	// zero is the shed package's default.
	Settings map[string]any `json:"settings,omitempty"`
}

// listing is the admin listing.
// It is a plain value.
type listing struct {
	File       string           `json:"file"`
	Reload     ReloadStats      `json:"reload"`
	Breakers   []breakerState   `json:"breakers"`
	Budgets    []budgetState    `json:"budgets"`
	Bulkheads  []bulkheadState  `json:"bulkheads"`
	Throttlers []throttlerState `json:"throttlers"`
	Hedges     []hedgeState     `json:"hedges"`
	Shedders   []shedderState   `json:"shedders"`
}

func throttlerStatus(dep string, t *throttle.Throttler, cfg throttle.Config) throttlerState {
	req, acc := t.Counts()
	return throttlerState{Dependency: dep, Requests: req, Accepts: acc, RejectProbability: t.RejectProbability(),
		Settings: map[string]any{"window": cmp.Or(cfg.Window, throttle.DefaultWindow).String(), "k": cmp.Or(cfg.K, throttle.DefaultK)}}
}

func hedgeStatus(dep string, h *guardrail.HedgeConfig) hedgeState {
	s := map[string]any{}
	for _, e := range hedgeEffective(h, nil) {
		if k, ok := strings.CutPrefix(e.Key, "hedge."); ok {
			s[k] = e.Value
		}
	}
	return hedgeState{Dependency: dep, Settings: s}
}

func breakerStatus(dep, key string, b *breaker.Breaker) breakerState {
	m := b.Metrics()
	c := b.Config()
	s := map[string]any{
		"mode": c.Mode.String(), "min_requests": c.MinRequests, "failure_rate": c.FailureRate,
		"open_for": c.OpenFor.String(), "open_jitter": c.OpenJitter, "half_open_probes": c.HalfOpenProbes,
		"close_after": c.CloseAfter, "consecutive_failures": c.ConsecutiveFailures,
	}
	if c.CountWindow > 0 {
		s["count_window"] = c.CountWindow
	} else {
		s["window"], s["buckets"] = c.Window.String(), c.Buckets
	}
	if c.SlowCall > 0 {
		s["slow_call"], s["slow_rate"] = c.SlowCall.String(), c.SlowRate
	}
	return breakerState{Dependency: dep, Key: key, State: m.State.String(), Forced: m.Forced, Calls: m.Calls,
		Failures: m.Failures, FailureRate: m.FailureRate, Opens: m.Opens, OpenUntil: m.OpenUntil, Settings: s}
}

// status returns what the admin endpoint lists.
func (r *Registry) status() listing {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := listing{File: r.path, Reload: r.Stats(), Breakers: []breakerState{}, Budgets: []budgetState{},
		Bulkheads: []bulkheadState{}, Throttlers: []throttlerState{}, Hedges: []hedgeState{}, Shedders: []shedderState{}}
	checked := r.checked.Load()
	// hedgeAndThrottle lists the throttler and hedging of a dependency.
	hedgeAndThrottle := func(name string, h *guardrail.HedgeConfig, t *throttle.Throttler, cfg *throttle.Config) {
		if t != nil && cfg != nil {
			st.Throttlers = append(st.Throttlers, throttlerStatus(name, t, *cfg))
		}
		if h != nil {
			st.Hedges = append(st.Hedges, hedgeStatus(name, h))
		}
	}
	budgetSettings := func(name string) map[string]any {
		for _, d := range checked.Dependencies {
			if d.Name == name && d.Budget != nil {
				return map[string]any{"ratio": orF(d.Budget.Ratio, budget.DefaultRatio), "max": orF(d.Budget.Max, budget.DefaultMax), "min_per_second": d.Budget.MinPerSecond}
			}
		}
		return nil
	}
	for _, name := range sortedKeys(r.https) {
		v := r.https[name].cur.Load()
		v.cfg.Breakers.Range(func(key string, b *breaker.Breaker) bool {
			st.Breakers = append(st.Breakers, breakerStatus(name, key, b))
			return true
		})
		st.Budgets = append(st.Budgets, budgetState{Dependency: name, Unlimited: isInf(v.cfg.Budget.Max()), Tokens: finite(v.cfg.Budget.Tokens()), Max: finite(v.cfg.Budget.Max()), Settings: budgetSettings(name)})
		hedgeAndThrottle(name, v.cfg.Hedge, v.cfg.Throttler, v.throttle)
	}
	for _, name := range sortedKeys(r.grpcs) {
		g := r.grpcs[name].Current()
		g.Breakers.Range(func(key string, b *breaker.Breaker) bool {
			st.Breakers = append(st.Breakers, breakerStatus(name, key, b))
			return true
		})
		st.Budgets = append(st.Budgets, budgetState{Dependency: name, Unlimited: isInf(g.Budget.Max()), Tokens: finite(g.Budget.Tokens()), Max: finite(g.Budget.Max()), Settings: budgetSettings(name)})
		hedgeAndThrottle(name, g.Hedge, g.Throttler, g.Throttle)
	}
	for _, name := range sortedKeys(r.policies) {
		pv := r.policies[name].cur.Load()
		p := pv.p
		st.Breakers = append(st.Breakers, breakerStatus(name, "", p.Breaker))
		st.Budgets = append(st.Budgets, budgetState{Dependency: name, Unlimited: isInf(p.Budget.Max()), Tokens: finite(p.Budget.Tokens()), Max: finite(p.Budget.Max()), Settings: budgetSettings(name)})
		if p.Bulkhead != nil {
			st.Bulkheads = append(st.Bulkheads, bulkheadState{Dependency: name, InFlight: p.Bulkhead.InFlight(), Waiting: p.Bulkhead.Waiting(), Limit: p.Bulkhead.Limit()})
		}
		hedgeAndThrottle(name, p.Hedge, p.Throttler, pv.throttle)
	}
	sort.SliceStable(st.Breakers, func(i, j int) bool {
		return st.Breakers[i].Dependency+"\x00"+st.Breakers[i].Key < st.Breakers[j].Dependency+"\x00"+st.Breakers[j].Key
	})
	for _, name := range sortedKeys(r.sheds) {
		s := r.sheds[name].Current().Stats()
		ss := shedderState{Server: name, InFlight: s.InFlight, Limit: s.Limit, Queued: s.Queued, Admitted: s.Admitted, Shed: s.Shed, ByReason: s.ShedByReason}
		if s.MinRTT > 0 {
			ss.MinRTT = s.MinRTT.String()
		}
		for _, srv := range checked.Servers {
			if c := srv.Shed; srv.Name == name && c != nil {
				ss.Settings = map[string]any{"limit": c.Limit, "max_queue": c.MaxQueue, "retry_ratio": c.RetryRatio,
					"retry_burst": c.RetryBurst, "retry_pressure": c.RetryPressure, "max_header_priority": c.MaxHeaderPriority.String(),
					"queue_target": c.QueueTarget.String(), "retry_after": c.RetryAfter.String()}
			}
		}
		st.Shedders = append(st.Shedders, ss)
	}
	return st
}

func isInf(f float64) bool { return f > 1e300 }

// finite keeps +Inf, which JSON cannot encode, out of the listing.
func finite(f float64) float64 {
	if isInf(f) {
		return -1
	}
	return f
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func (a *Admin) list(w http.ResponseWriter, r *http.Request) {
	if a.cfg.AuthorizeRead != nil {
		if err := a.cfg.AuthorizeRead(r); err != nil {
			a.log.Warn("config: admin listing refused", "path", r.URL.Path, "remote", r.RemoteAddr, "error", err)
			writeError(w, http.StatusForbidden, forbidden)
			return
		}
	}
	writeJSON(w, http.StatusOK, a.reg.status())
}

// notFound is an admin action on a dependency or key that does not exist;
// its message says what does.
type notFound struct{ msg string }

func (e *notFound) Error() string { return e.msg }

// breakersOf returns the breakers of dependency dep an action applies to,
// and their keys: key's, or every one the dependency holds when key is
// empty. It looks at the values in force for the dependency's kind in the
// file in force, which a reload may have changed, and never creates a
// breaker: what carries no traffic has none, and forcing one would report
// a success that protects nothing. A dependency or key that does not exist
// is a *notFound naming what does.
func (r *Registry) breakersOf(dep, key string) ([]*breaker.Breaker, []string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.checked.Load()
	d := c.dependency(dep)
	if d == nil {
		names := make([]string, 0, len(c.Dependencies))
		for _, d := range c.Dependencies {
			names = append(names, d.Name)
		}
		sort.Strings(names)
		return nil, nil, &notFound{fmt.Sprintf("no dependency %s; the dependencies are %s", quoteList([]string{dep}), quoteList(names))}
	}
	var g *breaker.Group
	switch d.Kind {
	case kindHTTP:
		if h := r.https[dep]; h != nil {
			g = h.cur.Load().cfg.Breakers
		}
	case kindGRPC:
		if h := r.grpcs[dep]; h != nil {
			g = h.Current().Breakers
		}
	default:
		p := r.policies[dep]
		if p == nil {
			break
		}
		if key != "" {
			return nil, nil, &notFound{fmt.Sprintf("dependency %s is a policy with one breaker, which has no key; leave key out", quoteList([]string{dep}))}
		}
		return []*breaker.Breaker{p.Policy().Breaker}, []string{""}, nil
	}
	var bs []*breaker.Breaker
	var keys []string
	if g != nil {
		g.Range(func(k string, b *breaker.Breaker) bool {
			if key == "" || k == key {
				bs = append(bs, b)
				keys = append(keys, k)
			}
			return true
		})
	}
	if len(bs) > 0 {
		return bs, keys, nil
	}
	var all []string
	if g != nil {
		g.Range(func(k string, _ *breaker.Breaker) bool {
			all = append(all, k)
			return true
		})
	}
	sort.Strings(all)
	msg := fmt.Sprintf("dependency %s has no breakers", quoteList([]string{dep}))
	if key != "" {
		msg = fmt.Sprintf("dependency %s has no breaker with key %s", quoteList([]string{dep}), quoteList([]string{key}))
	}
	if len(all) == 0 {
		return nil, nil, &notFound{msg + ": the first call to a key makes its breaker, and no call has made one under the settings in force"}
	}
	more := ""
	if len(all) > maxListedKeys {
		more = fmt.Sprintf(" and %d more (GET / lists them all)", len(all)-maxListedKeys)
		all = all[:maxListedKeys]
	}
	return nil, nil, &notFound{msg + "; its keys are " + quoteList(all) + more}
}

// maxListedKeys bounds the keys an error of breakersOf names: a group may
// hold a thousand.
const maxListedKeys = 20

// quoteList renders names as a list of Go-quoted strings, so that a name
// sent by a caller cannot forge the message around it.
func quoteList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// actionBody is the JSON body an action may carry instead of its query.
type actionBody struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

func (a *Admin) act(w http.ResponseWriter, r *http.Request) {
	if a.cfg.ReadOnly {
		writeError(w, http.StatusForbidden, "the admin endpoint is read-only")
		return
	}
	if err := a.cfg.Authorize(r); err != nil {
		a.log.Warn("config: admin action refused", "path", r.URL.Path, "remote", r.RemoteAddr, "error", err)
		writeError(w, http.StatusForbidden, forbidden)
		return
	}
	dep, action := r.PathValue("dependency"), r.PathValue("action")
	q := r.URL.Query()
	body := actionBody{Key: q.Get("key"), Reason: q.Get("reason")}
	if r.Body != nil && r.Body != http.NoBody && r.Header.Get("Content-Type") != "" {
		// The guard let only JSON through.
		var b actionBody
		dec := json.NewDecoder(io.LimitReader(r.Body, maxBodyBytes))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&b); err != nil && err != io.EOF {
			writeError(w, http.StatusBadRequest, `the body is not {"key": "...", "reason": "..."} of at most 4 KiB`)
			return
		}
		body.Key, body.Reason = cmp.Or(body.Key, b.Key), cmp.Or(body.Reason, b.Reason)
	}
	reason := strings.TrimSpace(body.Reason)
	key := body.Key
	if reason == "" || len(reason) > maxReasonLength {
		writeError(w, http.StatusBadRequest, "reason is required (at most 500 bytes): it goes to the log with the action")
		return
	}
	var do func(*breaker.Breaker)
	switch action {
	case "open":
		do = (*breaker.Breaker).ForceOpen
	case "close":
		do = (*breaker.Breaker).ForceClosed
	case "reset":
		do = (*breaker.Breaker).Reset
	default:
		writeError(w, http.StatusBadRequest, "action is "+strconv.Quote(action)+"; want open, close or reset")
		return
	}
	bs, keys, err := a.reg.breakersOf(dep, key)
	if err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	out := make([]breakerState, 0, len(bs))
	for i, b := range bs {
		do(b)
		a.log.Warn("config: admin breaker action", "action", action, "dependency", dep, "key", keys[i], "reason", reason, "remote", r.RemoteAddr)
		out = append(out, breakerStatus(dep, keys[i], b))
	}
	writeJSON(w, http.StatusOK, out)
}
