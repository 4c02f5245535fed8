package config

import (
	"cmp"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/extra/ratelimit"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/throttle"
)

// defaultMaxBufferedMessages is guardgrpc.DefaultMaxBufferedMessages, which
// this package cannot import without importing gRPC; a test of
// extra/grpcconfig keeps the two equal.
const defaultMaxBufferedMessages = 64

// Report is what guardrail check prints: per dependency the effective
// settings, what differs from the defaults and why, then the findings. It
// is a plain value that encodes as JSON.
type Report struct {
	File         string             `json:"file"`
	OK           bool               `json:"ok"`
	Dependencies []DependencyReport `json:"dependencies"`
	Servers      []ServerReport     `json:"servers"`
	Errors       []Diagnostic       `json:"errors"`
	Warnings     []Diagnostic       `json:"warnings"`
}

// DependencyReport is one dependency's part of a Report.
// It is a plain value.
type DependencyReport struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Reason   string `json:"reason,omitempty"`
	Owner    string `json:"owner,omitempty"`
	Decision string `json:"decision,omitempty"`
	// Differences are the settings whose effective value is not the
	// defaults'.
	Differences []Difference `json:"differences"`
	// Effective is every setting in force, library defaults included.
	Effective []Setting `json:"effective"`
}

// Difference is one setting that departs from the defaults.
// It is a plain value.
type Difference struct {
	Key     string `json:"key"`
	Value   string `json:"value"`
	Default string `json:"default"`
	Line    int    `json:"line"`
}

// Setting is one effective setting.
// It is a plain value.
type Setting struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// ServerReport is one server's part of a Report.
// It is a plain value.
type ServerReport struct {
	Name      string    `json:"name"`
	Reason    string    `json:"reason,omitempty"`
	Owner     string    `json:"owner,omitempty"`
	Effective []Setting `json:"effective"`
}

// report summarises c.
func (c *checkedFile) report() Report {
	rep := Report{File: c.Name, OK: len(c.Errors) == 0, Errors: c.Errors, Warnings: c.Warnings,
		Dependencies: []DependencyReport{}, Servers: []ServerReport{}}
	if rep.Errors == nil {
		rep.Errors = []Diagnostic{}
	}
	if rep.Warnings == nil {
		rep.Warnings = []Diagnostic{}
	}
	for _, d := range c.Dependencies {
		rep.Dependencies = append(rep.Dependencies, c.dependencyReport(d))
	}
	for _, s := range c.Servers {
		rep.Servers = append(rep.Servers, serverReport(s))
	}
	return rep
}

// dependencyReport reports d's effective settings, and those that differ
// from the defaults as d's kind sees them.
func (c *checkedFile) dependencyReport(d *resolvedDep) DependencyReport {
	dr := DependencyReport{Name: d.Name, Kind: d.Kind, Reason: val(d.Reason), Owner: val(d.Owner), Decision: val(d.Decision), Differences: []Difference{}}
	dr.Effective = effective(d)
	// The defaults as this dependency's kind sees them.
	base := &resolvedDep{Name: d.Name, Kind: d.Kind}
	if c.File.Defaults != nil {
		base.Settings = *c.File.Defaults
	}
	_ = (&checkedFile{Name: c.Name, File: c.File, lines: map[string]int{}}).build(base)
	baseEff := effective(base)
	defs := map[string]string{}
	for _, s := range baseEff {
		defs[s.Key] = s.Value
	}
	for _, s := range dr.Effective {
		def, ok := defs[s.Key]
		switch section, _, sub := strings.Cut(s.Key, "."); {
		case ok:
		case !sub:
			// A section the dependency turns off that the defaults
			// turn on ("hedge off" against their hedge settings).
			var on []string
			for _, b := range baseEff {
				if k, ok := strings.CutPrefix(b.Key, section+"."); ok {
					on = append(on, k+" "+b.Value)
				}
			}
			def = strings.Join(on, ", ")
		default:
			// A section the defaults leave out ("bulkhead none"), or a
			// setting they leave off (breaker.consecutive_failures).
			def = "off"
			if v, ok := defs[section]; ok {
				def = section + " " + v
			}
		}
		if def != s.Value {
			dr.Differences = append(dr.Differences, Difference{Key: s.Key, Value: s.Value, Default: def,
				Line: c.line("dependencies." + d.Name + "." + s.Key)})
		}
	}
	return dr
}

// serverReport reports s's effective settings.
func serverReport(s *resolvedServer) ServerReport {
	sr := ServerReport{Name: s.Name, Reason: val(s.Reason), Owner: val(s.Owner)}
	if d := s.Deadline; d != nil {
		sr.Effective = append(sr.Effective, Setting{"deadline.max", durOr(d.Max, 30*time.Second, "none")}, Setting{"deadline.reserve", durOr(d.Reserve, 10*time.Millisecond, "none")})
	}
	if sh := s.Shed; sh != nil {
		limit := "adaptive"
		if sh.Limit > 0 {
			limit = strconv.Itoa(sh.Limit)
		}
		sr.Effective = append(sr.Effective, Setting{"shed.limit", limit}, Setting{"shed.max_queue", strconv.Itoa(sh.MaxQueue)},
			Setting{"shed.retry_ratio", fmtFloat(orF(sh.RetryRatio, 0.1))}, Setting{"shed.max_header_priority", sh.MaxHeaderPriority.String()})
	}
	if id := s.Idempotency; id != nil {
		scope := "single_tenant"
		if s.IdempotencyScopeCaller {
			scope = "caller"
		}
		methods := "POST, PATCH"
		if id.Methods != nil {
			methods = strings.Join(id.Methods, ", ")
		}
		sr.Effective = append(sr.Effective, Setting{"idempotency.scope", scope}, Setting{"idempotency.methods", methods},
			Setting{"idempotency.required", strconv.FormatBool(id.Required)}, Setting{"idempotency.ttl", durOr(id.TTL, 24*time.Hour, "")},
			Setting{"idempotency.lease", durOr(id.Lease, 30*time.Second, "")})
	}
	if rl := s.RateLimit; rl != nil {
		rate := orF(rl.Rate, ratelimit.DefaultRate)
		burst := rl.Burst
		if burst == 0 {
			burst = int(math.Max(1, math.Ceil(rate)))
		}
		maxKeys := rl.MaxKeys
		if maxKeys == 0 {
			maxKeys = ratelimit.DefaultMaxKeys
		}
		sr.Effective = append(sr.Effective, Setting{"rate_limit.rate", fmtFloat(rate)},
			Setting{"rate_limit.burst", strconv.Itoa(burst)}, Setting{"rate_limit.max_keys", strconv.Itoa(maxKeys)})
	}
	return sr
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func orF(f, def float64) float64 {
	if f == 0 {
		return def
	}
	return f
}

// durOr renders d, def when zero, none when negative.
func durOr(d, def time.Duration, negative string) string {
	switch {
	case d == 0:
		d = def
	case d < 0 && negative != "":
		return negative
	}
	if d == 0 {
		return "none"
	}
	return d.String()
}

// settingList lists effective settings, in order.
type settingList []Setting

func (l *settingList) add(k, v string) { *l = append(*l, Setting{k, v}) }

// effective lists every setting d runs under, with the library's defaults
// for what the file leaves out.
func effective(d *resolvedDep) []Setting {
	var out settingList
	retryEffective(&out, d)
	breakerEffective(&out, d)
	bulkheadEffective(&out, d.Bulkhead)
	out = append(out, hedgeEffective(d.Hedge, d.Throttle)...)
	switch d.Kind {
	case kindPolicy:
		out.add("idempotent", strconv.FormatBool(d.Idempotent))
	case kindGRPC:
		grpcEffective(&out, &d.GRPC)
	default:
		httpEffective(&out, &d.HTTP)
	}
	return out
}

// retryEffective lists d's retry settings, its deadline and its budget.
func retryEffective(out *settingList, d *resolvedDep) {
	s := &d.Settings
	out.add("max_attempts", strconv.Itoa(d.attempts()))
	out.add("attempt_timeout", durOr(d.Retry.AttemptTimeout, 0, "none"))
	out.add("min_attempt_time", durOr(d.Retry.MinAttemptTime, guardrail.DefaultMinAttemptTime, "none"))
	out.add("max_retry_after", durOr(d.Retry.MaxRetryAfter, guardrail.DefaultMaxRetryAfter, "no limit"))
	out.add("deadline", durOr(d.Deadline, 0, "none"))
	strategy, base, cp := "full_jitter", backoff.DefaultBase, backoff.DefaultCap
	if b := s.Backoff; b != nil {
		if b.Strategy != nil {
			strategy = *b.Strategy
		}
		if v := val(b.Base); v > 0 {
			base = v
		}
		if v := val(b.Cap); v > 0 {
			cp = v
		}
	}
	out.add("backoff.strategy", strategy)
	if strategy != "none" {
		out.add("backoff.base", base.String())
	}
	if strategy != "none" && strategy != "constant" {
		out.add("backoff.cap", cp.String())
	}
	if d.Budget == nil {
		out.add("retry_budget", "unlimited")
	} else {
		out.add("retry_budget.ratio", fmtFloat(orF(d.Budget.Ratio, budget.DefaultRatio)))
		out.add("retry_budget.max", fmtFloat(orF(d.Budget.Max, budget.DefaultMax)))
		out.add("retry_budget.min_per_second", fmtFloat(d.Budget.MinPerSecond))
	}
}

// breakerEffective lists d's breaker settings, which come from a breaker
// built with its configuration.
func breakerEffective(out *settingList, d *resolvedDep) {
	bc := d.Breaker
	if d.Kind != kindPolicy {
		bc = d.Group.Config
	}
	// The window's size does not change the other settings; a small one
	// keeps a report of a file with large count windows from allocating
	// them.
	big := bc.CountWindow
	if big > 4096 && bc.MinRequests <= 4096 {
		bc.CountWindow = 4096
	}
	b, err := breaker.New(bc)
	if err != nil {
		return
	}
	e := b.Config()
	if big > e.CountWindow {
		e.CountWindow = big
	}
	out.add("breaker.mode", e.Mode.String())
	if e.CountWindow > 0 {
		out.add("breaker.count_window", strconv.Itoa(e.CountWindow))
	} else {
		out.add("breaker.window", e.Window.String())
		out.add("breaker.buckets", strconv.Itoa(e.Buckets))
	}
	out.add("breaker.min_requests", strconv.Itoa(e.MinRequests))
	out.add("breaker.failure_rate", fmtFloat(e.FailureRate))
	if e.ConsecutiveFailures > 0 {
		out.add("breaker.consecutive_failures", strconv.Itoa(e.ConsecutiveFailures))
	}
	if e.SlowCall > 0 {
		out.add("breaker.slow_call", e.SlowCall.String())
		out.add("breaker.slow_rate", fmtFloat(e.SlowRate))
	}
	out.add("breaker.open_for", e.OpenFor.String())
	out.add("breaker.open_jitter", fmtFloat(e.OpenJitter))
	if e.OpenBackoff > 1 {
		out.add("breaker.open_backoff", fmtFloat(e.OpenBackoff))
		out.add("breaker.max_open_for", e.MaxOpenFor.String())
	}
	out.add("breaker.half_open_probes", strconv.Itoa(e.HalfOpenProbes))
	out.add("breaker.close_after", strconv.Itoa(e.CloseAfter))
	if d.Kind != kindPolicy {
		out.add("breaker.max_keys", strconv.Itoa(cmp.Or(d.Group.MaxKeys, breaker.DefaultMaxKeys)))
		out.add("breaker.idle_ttl", durOr(d.Group.IdleTTL, breaker.DefaultIdleTTL, "none"))
	}
}

// bulkheadEffective lists the bulkhead b configures.
func bulkheadEffective(out *settingList, b *bulkhead.Config) {
	if b == nil {
		out.add("bulkhead", "none")
		return
	}
	out.add("bulkhead.max_concurrent", strconv.Itoa(cmp.Or(b.MaxConcurrent, bulkhead.DefaultMaxConcurrent)))
	out.add("bulkhead.max_queue", strconv.Itoa(b.MaxQueue))
	if b.MaxQueue > 0 {
		out.add("bulkhead.max_wait", durOr(b.MaxWait, bulkhead.DefaultMaxWait, "none"))
	}
}

// grpcEffective lists the settings of a gRPC dependency alone.
func grpcEffective(out *settingList, g *GRPCSettings) {
	methods := "none"
	if len(g.IdempotentMethods) > 0 {
		methods = strings.Join(g.IdempotentMethods, ", ")
	}
	out.add("idempotent_methods", methods)
	switch mb := g.MaxBufferedMessages; {
	case mb == 0:
		out.add("max_buffered_messages", strconv.Itoa(defaultMaxBufferedMessages))
	case mb < 0:
		out.add("max_buffered_messages", "none kept")
	default:
		out.add("max_buffered_messages", strconv.Itoa(mb))
	}
	fd := failureDomainTarget
	if g.ByMethod {
		fd = failureDomainMethod
	}
	out.add("failure_domain", fd)
}

// httpEffective lists the settings of an HTTP dependency alone.
func httpEffective(out *settingList, h *guardhttp.Config) {
	out.add("connect_timeout", durOr(h.ConnectTimeout, guardhttp.DefaultConnectTimeout, "none"))
	out.add("tls_handshake_timeout", durOr(h.TLSHandshakeTimeout, guardhttp.DefaultTLSHandshakeTimeout, "none"))
	out.add("write_timeout", durOr(h.WriteTimeout, guardhttp.DefaultWriteTimeout, "none"))
	out.add("response_header_timeout", durOr(h.ResponseHeaderTimeout, guardhttp.DefaultResponseHeaderTimeout, "none"))
	out.add("body_idle_timeout", durOr(h.BodyIdleTimeout, guardhttp.DefaultBodyIdleTimeout, "none"))
	switch mb := h.MaxBufferedBody; {
	case mb == 0:
		out.add("max_buffered_body", strconv.Itoa(guardhttp.DefaultMaxBufferedBody))
	case mb < 0:
		out.add("max_buffered_body", "never buffer")
	default:
		out.add("max_buffered_body", strconv.FormatInt(mb, 10))
	}
	out.add("idempotency_keys", strconv.FormatBool(h.IdempotencyKeys))
	out.add("deadline_reserve", durOr(h.DeadlineReserve, guardhttp.DefaultDeadlineReserve, "none"))
}

// hedgeEffective lists the hedge and throttle settings in force, with the
// core's defaults for what the file leaves out.
func hedgeEffective(h *guardrail.HedgeConfig, t *throttle.Config) []Setting {
	var out []Setting
	add := func(k, v string) { out = append(out, Setting{k, v}) }
	if h == nil {
		add("hedge", "off")
	} else {
		pct := h.Percentile
		if pct == 0 && h.Delay == 0 {
			pct = guardrail.DefaultHedgePercentile
		}
		if pct == 0 {
			add("hedge.delay", "fixed "+h.Delay.String())
		} else {
			floor := "no floor"
			if h.Delay > 0 {
				floor = "at least " + h.Delay.String()
			}
			add("hedge.delay", "adaptive, "+floor)
			add("hedge.percentile", fmtFloat(pct))
			add("hedge.window", strconv.Itoa(cmp.Or(h.Window, guardrail.DefaultHedgeWindow)))
		}
		add("hedge.max_hedges", strconv.Itoa(max(h.MaxHedges, 1)))
		add("hedge.overload_pause", cmp.Or(h.OverloadPause, guardrail.DefaultHedgeOverloadPause).String())
	}
	if t == nil {
		add("throttle", "off")
	} else {
		add("throttle.window", cmp.Or(t.Window, throttle.DefaultWindow).String())
		add("throttle.k", fmtFloat(cmp.Or(t.K, throttle.DefaultK)))
	}
	return out
}
