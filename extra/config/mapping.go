package config

import (
	"slices"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/extra/ratelimit"
	"github.com/guardrail-go/guardrail/fleet"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/shed"
	"github.com/guardrail-go/guardrail/throttle"
)

// This file is the one place where the sections of the policy file
// (file.go) become the configuration types of the guardrail core:
// guardrail.Retry, guardhttp.Config, GRPCSettings, breaker.Config,
// bulkhead.Config, budget.Config, guardrail.HedgeConfig,
// throttle.Config, deadline.Config, shed.Config,
// ratelimit.Config and idempotency.Config. Every setting is declared once,
// in the core: the file's structs only say which key sets which field, a
// nil pointer meaning the core's default. The checks (resolve.go) validate
// what these functions return with the constructors that will use it, and
// the Registry (registry.go) builds from it.

// retryOf returns the retry settings s sets, with strategy as the
// backoff, and no Budget: the Registry supplies the budget, built from
// budgetConfig's.
func retryOf(s *fileSettings, strategy backoff.Strategy) guardrail.Retry {
	return guardrail.Retry{
		MaxAttempts:    val(s.MaxAttempts),
		AttemptTimeout: val(s.AttemptTimeout),
		MinAttemptTime: val(s.MinAttemptTime),
		Backoff:        strategy,
		MaxRetryAfter:  val(s.MaxRetryAfter),
	}
}

// backoffStrategy returns the strategy b selects, nil for the engine's
// default; false when its strategy has no such name.
func backoffStrategy(b *fileBackoff) (backoff.Strategy, bool) {
	if b == nil {
		return nil, true
	}
	base, cp := val(b.Base), val(b.Cap)
	switch val(b.Strategy) {
	case "", "full_jitter":
		if b.Base == nil && b.Cap == nil {
			return nil, true // the engine's default, which is full jitter from 100 ms to 10 s
		}
		return backoff.FullJitter(base, cp), true
	case "equal_jitter":
		return backoff.EqualJitter(base, cp), true
	case "exponential":
		return backoff.Exponential(base, cp), true
	case "decorrelated":
		return backoff.Decorrelated(base, cp), true
	case "constant":
		return backoff.Constant(base), true
	case "none":
		return backoff.None(), true
	}
	return nil, false
}

// budgetConfig returns the retry budget rb configures; nil when it is
// unlimited (budget.Unlimited).
func budgetConfig(rb *fileRetryBudget) *budget.Config {
	if rb == nil {
		return &budget.Config{}
	}
	if val(rb.Unlimited) {
		return nil
	}
	return &budget.Config{Ratio: val(rb.Ratio), Max: val(rb.Max), MinPerSecond: val(rb.MinPerSecond)}
}

// breakerConfig returns the breaker b configures for dependency name;
// false when its mode has no such name.
func breakerConfig(name string, b *fileBreaker) (breaker.Config, bool) {
	if b == nil {
		return breaker.Config{Name: name}, true
	}
	c := breaker.Config{
		Name:   name,
		Window: val(b.Window), Buckets: val(b.Buckets), CountWindow: val(b.CountWindow),
		MinRequests: val(b.MinRequests), FailureRate: val(b.FailureRate), SlowCall: val(b.SlowCall),
		SlowRate: val(b.SlowRate), OpenFor: val(b.OpenFor), OpenJitter: val(b.OpenJitter),
		OpenBackoff: val(b.OpenBackoff), MaxOpenFor: val(b.MaxOpenFor),
		HalfOpenProbes: val(b.HalfOpenProbes), CloseAfter: val(b.CloseAfter),
		ConsecutiveFailures: val(b.ConsecutiveFailures),
	}
	switch val(b.Mode) {
	case "", "normal":
	case "metrics_only":
		c.Mode = breaker.MetricsOnly
	case "disabled":
		c.Mode = breaker.Disabled
	default:
		return c, false
	}
	return c, true
}

// breakerGroupConfig returns the group of breakers (one per host, target
// or method) of c that b bounds.
func breakerGroupConfig(b *fileBreaker, c breaker.Config) breaker.GroupConfig {
	g := breaker.GroupConfig{Config: c}
	if b != nil {
		g.MaxKeys, g.IdleTTL = val(b.MaxKeys), val(b.IdleTTL)
	}
	return g
}

// bulkheadConfig returns the bulkhead bh configures; nil when there is
// none or it is disabled.
func bulkheadConfig(bh *fileBulkhead) *bulkhead.Config {
	if bh == nil || val(bh.Disabled) {
		return nil
	}
	return &bulkhead.Config{MaxConcurrent: val(bh.MaxConcurrent), MaxQueue: val(bh.MaxQueue), MaxWait: val(bh.MaxWait)}
}

// hedgeConfig returns the hedging h configures; nil when there is none or
// it is disabled.
func hedgeConfig(h *fileHedge) *guardrail.HedgeConfig {
	if h == nil || val(h.Disabled) {
		return nil
	}
	return &guardrail.HedgeConfig{Delay: val(h.Delay), Percentile: val(h.Percentile), MaxHedges: val(h.MaxHedges),
		Window: val(h.Window), OverloadPause: val(h.OverloadPause)}
}

// throttleConfig returns the adaptive throttle t configures; nil when
// there is none or it is disabled.
func throttleConfig(t *fileThrottle) *throttle.Config {
	if t == nil || val(t.Disabled) {
		return nil
	}
	return &throttle.Config{Window: val(t.Window), K: val(t.K)}
}

// cloneHedge returns a copy of h, so that a HedgeConfig handed out is the
// caller's own.
func cloneHedge(h *guardrail.HedgeConfig) *guardrail.HedgeConfig {
	if h == nil {
		return nil
	}
	c := *h
	return &c
}

// httpConfig returns the guardhttp.Config of HTTP dependency r, without
// the Budget, Breakers, Throttler and Observer the Registry supplies.
func httpConfig(r *resolvedDep) guardhttp.Config {
	s := &r.Settings
	return guardhttp.Config{
		Name: r.Name, Retry: r.Retry,
		ConnectTimeout: val(s.ConnectTimeout), TLSHandshakeTimeout: val(s.TLSHandshakeTimeout),
		WriteTimeout: val(s.WriteTimeout), ResponseHeaderTimeout: val(s.ResponseHeaderTimeout),
		BodyIdleTimeout: val(s.BodyIdleTimeout), MaxBufferedBody: val(s.MaxBufferedBody),
		IdempotencyKeys: val(s.IdempotencyKeys), DeadlineReserve: val(s.DeadlineReserve),
		Bulkhead: r.Bulkhead, Hedge: cloneHedge(r.Hedge),
	}
}

// Failure domains of a gRPC dependency: what gets a breaker and a
// bulkhead compartment of its own.
const (
	failureDomainTarget = "target" // each connection target, as guardgrpc does by default
	failureDomainMethod = "method" // each method of each target: guardgrpc.ByMethod
)

// grpcSettings returns the settings of gRPC dependency r, without the
// Budget, Breakers, Bulkheads, Throttler and Observer the Registry
// supplies; false when its failure domain has no such name.
func grpcSettings(r *resolvedDep) (GRPCSettings, bool) {
	s := &r.Settings
	g := GRPCSettings{
		Name: r.Name, Retry: r.Retry,
		IdempotentMethods: slices.Clone(s.IdempotentMethods), MaxBufferedMessages: val(s.MaxBufferedMessages),
		Bulkhead: r.Bulkhead, Deadline: r.Deadline, Hedge: cloneHedge(r.Hedge), Throttle: r.Throttle,
	}
	switch val(s.FailureDomain) {
	case "", failureDomainTarget:
	case failureDomainMethod:
		g.ByMethod = true
	default:
		return g, false
	}
	return g, true
}

// deadlineConfig returns the server deadline d configures; nil when there
// is none.
func deadlineConfig(d *fileDeadline) *deadline.Config {
	if d == nil {
		return nil
	}
	return &deadline.Config{Max: val(d.Max), Reserve: val(d.Reserve)}
}

// shedConfig returns the shedder sh configures for server name, and the
// keys (max_header_priority, shares.NAME) that name no priority.
func shedConfig(name string, sh *fileShed) (shed.Config, []string) {
	var bad []string
	cfg := shed.Config{Name: name, Limit: val(sh.Limit), MaxQueue: val(sh.MaxQueue), RetryRatio: val(sh.RetryRatio),
		RetryBurst: val(sh.RetryBurst), RetryPressure: val(sh.RetryPressure), QueueInterval: val(sh.QueueInterval),
		MaxQueueWait: val(sh.MaxQueueWait), QueueTarget: val(sh.QueueTarget), RetryAfter: val(sh.RetryAfter)}
	if sh.MaxHeaderPriority != nil {
		p, ok := shed.ParsePriority(*sh.MaxHeaderPriority)
		if !ok {
			bad = append(bad, "max_header_priority")
		}
		cfg.MaxHeaderPriority = p
	}
	if sh.Shares != nil {
		cfg.Shares = map[shed.Priority]float64{}
		for k, v := range sh.Shares {
			p, ok := shed.ParsePriority(k)
			if !ok {
				bad = append(bad, "shares."+k)
				continue
			}
			cfg.Shares[p] = v
		}
	}
	if a := sh.Adaptive; a != nil {
		cfg.Adaptive = shed.Adaptive{InitialLimit: val(a.InitialLimit), MinLimit: val(a.MinLimit), MaxLimit: val(a.MaxLimit),
			Window: val(a.Window), Percentile: val(a.Percentile), Buffer: val(a.Buffer), MinRTTInterval: val(a.MinRTTInterval),
			MinRTTSamples: val(a.MinRTTSamples), Smoothing: val(a.Smoothing)}
	}
	return cfg, bad
}

// rateLimitConfig returns the rate limiter rl configures for server name,
// without its Key function, which the code passes; nil when there is none.
func rateLimitConfig(name string, rl *fileRateLimit) *ratelimit.Config {
	if rl == nil {
		return nil
	}
	return &ratelimit.Config{Name: name, Rate: val(rl.Rate), Burst: val(rl.Burst), MaxKeys: val(rl.MaxKeys),
		IPv6PrefixBits: val(rl.IPv6PrefixBits)}
}

// Values of rate_limit.shared.on_store_failure.
const (
	storeFailOpen   = "open"
	storeFailClosed = "closed"
)

// sharedLimitConfig returns the fleet limiter rl's shared section
// configures, without its Store; nil when there is none. ok is false when
// on_store_failure is neither open nor closed.
func sharedLimitConfig(rl *fileRateLimit) (cfg *fleet.LimiterConfig, ok bool) {
	if rl == nil || rl.Shared == nil {
		return nil, true
	}
	sh := rl.Shared
	cfg = &fleet.LimiterConfig{Rate: val(rl.Rate), Burst: val(rl.Burst), MaxKeys: val(rl.MaxKeys),
		Lease: val(sh.Lease), MaxLease: val(sh.MaxLease), StoreTimeout: val(sh.StoreTimeout), ProbeInterval: val(sh.ProbeInterval)}
	if n := val(sh.Members); n > 0 {
		cfg.Members = fleet.Fixed(n)
	}
	switch val(sh.OnStoreFailure) {
	case "", storeFailOpen:
	case storeFailClosed:
		cfg.OnStoreFailure = fleet.FailClosed
	default:
		return cfg, false
	}
	return cfg, true
}

// Scopes of a server's idempotency keys.
const (
	scopeSingleTenant = "single_tenant" // every caller in one key scope
	scopeCaller       = "caller"        // the code passes the Scope function
)

// idempotencyConfig returns the idempotency middleware id configures for
// server name, without its store and functions; SingleTenant is set when
// the scope is single_tenant.
func idempotencyConfig(name string, id *fileIdempotency) idempotency.Config {
	return idempotency.Config{Name: name, Methods: id.Methods, Required: val(id.Required), MaxKeyLength: val(id.MaxKeyLength),
		MaxBodyBytes: val(id.MaxBodyBytes), MaxResponseBytes: val(id.MaxResponseBytes), MaxKeysPerScope: val(id.MaxKeysPerScope),
		TTL: val(id.TTL), Lease: val(id.Lease),
		DisableLeaseRenewal: val(id.DisableLeaseRenewal), CancelOnLeaseLost: val(id.CancelOnLeaseLost),
		StoreTimeout: val(id.StoreTimeout), StoredHeaders: id.StoredHeaders, RetryAfter: val(id.RetryAfter),
		FailOpen: val(id.FailOpen), DocsURL: val(id.DocsURL), SingleTenant: val(id.Scope) == scopeSingleTenant}
}
