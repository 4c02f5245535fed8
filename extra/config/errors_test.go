package config

import (
	"strings"
	"testing"
)

// mutate replaces old, which must occur once in the documented example,
// by new, and returns the file and the line on which marker appears in it.
func mutate(t *testing.T, old, new, marker string) ([]byte, int) {
	t.Helper()
	doc := string(docExample(t))
	if n := strings.Count(doc, old); n != 1 {
		t.Fatalf("%q occurs %d times in the example; want once", old, n)
	}
	doc = strings.Replace(doc, old, new, 1)
	i := strings.Index(doc, marker)
	if i < 0 {
		t.Fatalf("marker %q not in the mutated file", marker)
	}
	return []byte(doc), strings.Count(doc[:i], "\n") + 1
}

// brokenCopies are broken copies of the documented example: each names the
// line its error must be on (the line of marker) and what it must say.
var brokenCopies = []struct {
	name, old, new, marker, want string
}{
	{"duration without unit", "    attempt_timeout: 1500ms\n", "    attempt_timeout: 5\n", "attempt_timeout: 5",
		`dependencies.payments.attempt_timeout: "5" has no unit; write 5s`},
	// A bare number of 100 or more in a key whose sensible values are
	// under a minute was written in milliseconds; anywhere else, and
	// below 100, in seconds.
	{"attempt timeout in milliseconds", "    attempt_timeout: 1500ms\n", "    attempt_timeout: 700\n", "attempt_timeout: 700",
		`dependencies.payments.attempt_timeout: "700" has no unit; write 700ms`},
	{"attempt timeout of 99", "    attempt_timeout: 1500ms\n", "    attempt_timeout: 99\n", "attempt_timeout: 99",
		`dependencies.payments.attempt_timeout: "99" has no unit; write 99s`},
	{"max wait in milliseconds", "      max_wait: 100ms", "      max_wait: 100", "max_wait: 100",
		`dependencies.payments.bulkhead.max_wait: "100" has no unit; write 100ms`},
	{"server deadline in milliseconds", "      max: 5s", "      max: 5000", "max: 5000",
		`servers.api.deadline.max: "5000" has no unit; write 5000ms`},
	{"open_for in seconds", "    open_for: 30s", "    open_for: 300", "open_for: 300",
		`defaults.breaker.open_for: "300" has no unit; write 300s`},
	{"lease in seconds", "      lease: 30s", "      lease: 300", "lease: 300",
		`servers.api.idempotency.lease: "300" has no unit; write 300s`},
	{"duration not a duration", "      lease: 30s", "      lease: soon", "lease: soon",
		`servers.api.idempotency.lease: "soon" is not a duration`},
	{"unknown key", "    max_attempts: 2\n", "    max_attemps: 2\n", "max_attemps",
		"dependencies.payments.max_attemps: is not a known setting (did you mean max_attempts?)"},
	{"missing reason", "    reason: \"Charges take", "    owner2: \"Charges take", "owner2",
		"dependencies.payments.owner2: is not a known setting"},
	{"override without reason", "    reason: \"Ledger writes carry", "    decision: \"Ledger writes carry", "  ledger:",
		"dependencies.ledger.reason: is missing; ledger overrides attempt_timeout, throttle, idempotent"},
	{"core breaker error", "      min_requests: 50\n", "      min_requests: 50\n      failure_rate: 1.5\n", "failure_rate: 1.5",
		"dependencies.payments.breaker.failure_rate: is 1.5; want a value in (0, 1], or zero for the default (breaker: Config.FailureRate)"},
	{"core error inherited from the defaults", "    min_requests: 20\n", "    min_requests: -1\n", "min_requests: -1",
		"defaults.breaker.min_requests: is -1; want a positive count"},
	{"negative consecutive failures", "      min_requests: 50\n", "      min_requests: 50\n      consecutive_failures: -1\n", "consecutive_failures: -1",
		"dependencies.payments.breaker.consecutive_failures: is -1; want 0 (off) to 65535 (breaker: Config.ConsecutiveFailures)"},
	{"consecutive failures past the run counter", "    min_requests: 20\n", "    min_requests: 20\n    consecutive_failures: 65536\n", "consecutive_failures: 65536",
		"defaults.breaker.consecutive_failures: is 65536; want 0 (off) to 65535"},
	{"unknown kind", "  catalog:\n    kind: http", "  catalog:\n    kind: soap", "kind: soap",
		`dependencies.catalog.kind: is "soap"; want http, grpc or policy`},
	{"http key on a grpc dependency", "    max_buffered_messages: 16\n", "    max_buffered_messages: 16\n    response_header_timeout: 1100ms\n", "response_header_timeout: 1100ms",
		"dependencies.inventory.response_header_timeout: applies to http dependencies only; this one is kind grpc"},
	{"grpc key on an http dependency", "    idempotency_keys: true\n", "    idempotency_keys: true\n    idempotent_methods: [/payments.v1.Charges/]\n", "idempotent_methods",
		"dependencies.payments.idempotent_methods: applies to grpc dependencies only; this one is kind http"},
	{"policy key on a grpc dependency", "    max_buffered_messages: 16\n", "    max_buffered_messages: 16\n    idempotent: true\n", "idempotent: true\n    hedge",
		"dependencies.inventory.idempotent: applies to policy dependencies only; this one is kind grpc; list the methods that are safe to repeat in idempotent_methods"},
	{"group key on a policy dependency", "    attempt_timeout: 800ms\n\n  inventory", "    attempt_timeout: 800ms\n    breaker: {max_keys: 5}\n\n  inventory", "breaker: {max_keys: 5}",
		"dependencies.ledger.breaker.max_keys: applies to http and grpc dependencies only; this one is kind policy"},
	{"grpc method name", "[/inventory.v1.Stock/]", "[inventory.v1.Stock]", "[inventory.v1.Stock]",
		`dependencies.inventory.idempotent_methods[0]: is "inventory.v1.Stock"; want a full method name such as /pkg.Service/Method`},
	{"grpc failure domain", "failure_domain: method", "failure_domain: host", "failure_domain: host",
		`dependencies.inventory.failure_domain: is "host"; want target`},
	{"grpc route with a path", "{method: /inventory.v1.Stock/Get}", "{method: /inventory.v1.Stock/Get, path: /stock}", "path: /stock",
		"dependencies.inventory.routes[0].path: applies to http dependencies only; a gRPC route is its full method name"},
	{"grpc route method", "{method: /inventory.v1.Stock/Get}", "{method: Get}", "{method: Get}",
		`dependencies.inventory.routes[0].method: is "Get"; want a full method name`},
	{"grpc core policy error", "    attempt_timeout: 250ms\n", "    attempt_timeout: -1s\n", "attempt_timeout: -1s",
		"dependencies.inventory.attempt_timeout: is -1s; want a positive duration, or zero for none (guardrail: Policy.AttemptTimeout)"},
	{"grpc core bulkhead error", "      max_concurrent: 32", "      max_concurrent: -1", "max_concurrent: -1",
		"dependencies.inventory.bulkhead.max_concurrent: is -1; want 1 to 4294967295"},
	{"grpc core breaker error", "      consecutive_failures: 5\n", "      consecutive_failures: -5\n", "consecutive_failures: -5",
		"dependencies.inventory.breaker.consecutive_failures: is -5; want 0 (off) to 65535"},
	{"grpc breaker group error", "      max_keys: 100\n", "      max_keys: -1\n", "max_keys: -1",
		"dependencies.inventory.breaker.max_keys: is -1; want a positive count, or zero for the default (breaker: GroupConfig.MaxKeys)"},
	{"grpc buffered messages not a number", "max_buffered_messages: 16", "max_buffered_messages: many", "many",
		`dependencies.inventory.max_buffered_messages: is "many"; want a whole number`},
	{"not a number", "    max_attempts: 2\n", "    max_attempts: two\n", "max_attempts: two",
		`dependencies.payments.max_attempts: is "two"; want a whole number`},
	{"duplicate key", "    max_attempts: 2\n", "    max_attempts: 2\n    max_attempts: 3\n", "max_attempts: 3\n    attempt_timeout: 1500ms",
		"dependencies.payments.max_attempts: appears twice"},
	{"calls an unknown dependency", "calls: [catalog]", "calls: [katalog]", "calls: [katalog]",
		`dependencies.pricing.calls[0]: names "katalog", which is not a dependency`},
	{"idempotency scope", "scope: single_tenant", "scope: everyone", "scope: everyone",
		`servers.api.idempotency.scope: is "everyone"; want caller`},
	{"shed priority", "shares: {sheddable: 0.5, low: 0.7}", "shares: {sheddable: 0.5, lowest: 0.7}", "lowest",
		"servers.api.shed.shares.lowest: is not a priority"},
	{"core budget error", "    ratio: 0.1 ", "    ratio: 2000 ", "ratio: 2000",
		"defaults.retry_budget.ratio: is 2000; want a value in (0, 1000]"},
	{"core bulkhead error", "      max_concurrent: 64", "      max_concurrent: -1", "max_concurrent: -1",
		"dependencies.payments.bulkhead.max_concurrent: is -1; want 1 to 4294967295"},
	{"core deadline error", "      reserve: 20ms", "      reserve: 6s", "reserve: 6s",
		"servers.api.deadline.reserve: is 6s (6s in force); want less than Config.Max's 5s"},
	{"core shed error", "      retry_ratio: 0.1", "      retry_ratio: 0.1\n      retry_pressure: 2", "retry_pressure: 2",
		"servers.api.shed.retry_pressure: is 2; want a value in (0, 1]"},
	{"key of the other kind", "    idempotency_keys: true\n", "    idempotency_keys: true\n    idempotent: true\n", "idempotent: true",
		"dependencies.payments.idempotent: applies to policy dependencies only"},
	{"core policy error", "    attempt_timeout: 800ms\n\n  inventory", "    attempt_timeout: -1s\n\n  inventory", "attempt_timeout: -1s",
		"dependencies.ledger.attempt_timeout: is -1s; want a positive duration, or zero for none (guardrail: Policy.AttemptTimeout)"},
	{"core guardhttp error beside a bulkhead", "    max_attempts: 2\n", "    max_attempts: -2\n", "max_attempts: -2",
		"dependencies.payments.max_attempts: is -2; want 1 or more, or zero for the default (guardhttp: Config.MaxAttempts)"},
	{"breaker mode", "      min_requests: 50\n", "      min_requests: 50\n      mode: off\n", "mode: off",
		`dependencies.payments.breaker.mode: is "off"; want normal, metrics_only or disabled`},
	{"a list where a mapping goes", "    bulkhead:\n      max_concurrent: 64\n      max_queue: 16\n      max_wait: 100ms\n", "    bulkhead: [64]\n", "bulkhead: [64]",
		"dependencies.payments.bulkhead: is a list; want a mapping of settings"},
	{"syntax error", "    max_attempts: 2\n", "\tmax_attempts: 2\n", "\tmax_attempts",
		"indented with a tab"},
	{"unclosed list", "calls: [catalog]", "calls: [catalog", "calls: [catalog", "not valid YAML: did not find expected ',' or ']'"},
	{"version", "version: 1", "version: 2", "version: 2", "version: is 2; want 1"},
	{"alias", "    max_attempts: 2\n", "    max_attempts: &two 2\n    body_idle_timeout: *two\n", "&two",
		"anchors and aliases are not supported"},

	// Hedging and throttling: every value the core refuses is refused on
	// its key, with what the core allows.
	{"hedge delay negative", "      delay: 20ms ", "      delay: -20ms ", "delay: -20ms",
		"dependencies.pricing.hedge.delay: is -20ms; want a positive duration, or zero for an adaptive delay (guardrail: HedgeConfig.Delay)"},
	{"hedge delay without unit", "      delay: 20ms ", "      delay: 20 ", "delay: 20",
		`dependencies.pricing.hedge.delay: "20" has no unit; write 20s`},
	{"hedge delay in milliseconds", "hedge: {delay: 150ms}", "hedge: {delay: 150}", "hedge: {delay: 150}",
		`dependencies.inventory.hedge.delay: "150" has no unit; write 150ms`},
	{"hedge percentile of 1", "percentile: 0.95 ", "percentile: 1 ", "percentile: 1",
		"dependencies.pricing.hedge.percentile: is 1; want a value in (0, 1), or zero (guardrail: HedgeConfig.Percentile)"},
	{"hedge percentile negative", "percentile: 0.95 ", "percentile: -0.5 ", "percentile: -0.5",
		"dependencies.pricing.hedge.percentile: is -0.5; want a value in (0, 1), or zero"},
	{"hedge percentile not a number", "percentile: 0.95 ", "percentile: p95 ", "percentile: p95",
		`dependencies.pricing.hedge.percentile: is "p95"; want a number such as 0.5`},
	{"hedge max hedges negative", "      max_hedges: 1\n", "      max_hedges: -1\n", "max_hedges: -1",
		"dependencies.pricing.hedge.max_hedges: is -1; want 1 to 16, or zero for 1 (guardrail: HedgeConfig.MaxHedges)"},
	{"hedge window too small", "      max_hedges: 1\n", "      max_hedges: 1\n      window: 19\n", "window: 19",
		"dependencies.pricing.hedge.window: is 19; want 20 to 1048576, or zero for the default (1000) (guardrail: HedgeConfig.Window)"},
	{"hedge window negative", "      max_hedges: 1\n", "      max_hedges: 1\n      window: -1000\n", "window: -1000",
		"dependencies.pricing.hedge.window: is -1000; want 20 to 1048576"},
	{"hedge window too large", "      max_hedges: 1\n", "      max_hedges: 1\n      window: 1048577\n", "window: 1048577",
		"dependencies.pricing.hedge.window: is 1048577; want at most 1048576: the window keeps that many latencies in memory"},
	{"hedge max hedges too many", "      max_hedges: 1\n", "      max_hedges: 17\n", "max_hedges: 17",
		"dependencies.pricing.hedge.max_hedges: is 17; want at most 16: each hedge is one more request in flight per call"},
	{"hedge overload pause negative", "      max_hedges: 1\n", "      max_hedges: 1\n      overload_pause: -1s\n", "overload_pause: -1s",
		"dependencies.pricing.hedge.overload_pause: is -1s; want a positive duration, or zero for the default (guardrail: HedgeConfig.OverloadPause)"},
	{"every hedge error at once", "      max_hedges: 1\n", "      max_hedges: -3\n      overload_pause: -1s\n", "overload_pause: -1s",
		"dependencies.pricing.hedge.overload_pause: is -1s"},
	{"hedge unknown key", "      max_hedges: 1\n", "      max_hedge: 1\n", "max_hedge:",
		"dependencies.pricing.hedge.max_hedge: is not a known setting (did you mean max_hedges?); want one of delay, percentile, max_hedges, window, overload_pause, disabled"},
	{"hedge disabled beside settings", "      max_hedges: 1\n", "      max_hedges: 1\n      disabled: true\n", "disabled: true",
		"dependencies.pricing.hedge.disabled: is true with delay set beside it; want either disabled or hedge settings"},
	{"hedge not a mapping", "    hedge:\n      percentile: 0.95      # hedge a request slower than 95 % of the recent ones\n      delay: 20ms           # and never sooner than this\n      max_hedges: 1\n", "    hedge: true\n", "hedge: true",
		`dependencies.pricing.hedge: is "true"; want a mapping of settings`},
	{"hedge error inherited from the defaults", "  deadline_reserve: 5ms\n", "  deadline_reserve: 5ms\n  hedge: {window: 5}\n", "hedge: {window: 5}",
		"defaults.hedge.window: is 5; want 20 to 1048576"},
	{"throttle k below 1", "      k: 2 ", "      k: 0.99 ", "k: 0.99",
		"dependencies.pricing.throttle.k: is 0.99; want 1 or more, or zero for the default (2) (throttle: Config.K)"},
	{"throttle k negative", "      k: 2 ", "      k: -2 ", "k: -2",
		"dependencies.pricing.throttle.k: is -2; want 1 or more"},
	{"throttle k infinite", "      k: 2 ", "      k: .inf ", "k: .inf",
		`dependencies.pricing.throttle.k: is ".inf"; want a number such as 0.5`},
	{"throttle window negative", "      window: 2m\n", "      window: -2m\n", "window: -2m",
		"dependencies.pricing.throttle.window: is -2m0s; want a positive duration, or zero for the default (2m0s) (throttle: Config.Window)"},
	{"throttle window without unit", "      window: 2m\n", "      window: 120\n", "window: 120",
		`dependencies.pricing.throttle.window: "120" has no unit; write 120s`},
	{"throttle unknown key", "      k: 2 ", "      K: 2 ", "K: 2",
		"dependencies.pricing.throttle.K: is not a known setting (did you mean k?); want one of window, k, disabled"},
	{"throttle disabled beside settings", "      k: 2 ", "      disabled: true\n      k: 2 ", "disabled: true",
		"dependencies.pricing.throttle.disabled: is true with window set beside it; want either disabled or throttle settings"},
	{"throttle on a policy inherited from the defaults", "  deadline_reserve: 5ms\n", "  deadline_reserve: 5ms\n  throttle: {k: 0.5}\n", "throttle: {k: 0.5}",
		"defaults.throttle.k: is 0.5; want 1 or more"},
	{"throttle without a reason", "    reason: \"Prices are reads", "    decision: \"Prices are reads", "  pricing:",
		"dependencies.pricing.reason: is missing; pricing overrides hedge.delay, hedge.percentile, hedge.max_hedges, throttle.window, throttle.k"},
	{"grpc hedge delay", "hedge: {delay: 150ms}", "hedge: {delay: -50ms, max_hedges: 2}", "hedge: {delay",
		"dependencies.inventory.hedge.delay: is -50ms; want a positive duration, or zero for an adaptive delay (guardrail: HedgeConfig.Delay)"},
	{"grpc hedges too many", "hedge: {delay: 150ms}", "hedge: {max_hedges: 100}", "hedge: {max",
		"dependencies.inventory.hedge.max_hedges: is 100; want at most 16"},
	{"grpc throttle k", "    max_buffered_messages: 16\n", "    max_buffered_messages: 16\n    throttle: {k: 0.5}\n", "throttle: {k",
		"dependencies.inventory.throttle.k: is 0.5; want 1 or more, or zero for the default (2) (throttle: Config.K)"},
}

func TestBrokenCopiesNameTheirLine(t *testing.T) {
	for _, tc := range brokenCopies {
		t.Run(tc.name, func(t *testing.T) {
			data, line := mutate(t, tc.old, tc.new, tc.marker)
			c, err := parse("policy.yaml", data)
			if err == nil {
				t.Fatalf("Parse accepted the broken copy")
			}
			for _, d := range c.Errors {
				if d.Line == line && strings.Contains(d.String(), tc.want) && d.File == "policy.yaml" {
					return
				}
			}
			t.Errorf("no error on line %d saying %q; got:\n%v", line, tc.want, err)
		})
	}
}

// riskyCopies are valid copies of the example that must warn, on the line
// of marker, saying why.
var riskyCopies = []struct {
	name, old, new, marker, want string
}{
	{"breaker without minimum", "      min_requests: 50\n", "      min_requests: 1\n", "min_requests: 1",
		"one early failure opens the breaker"},
	{"no retry budget", "    max_attempts: 2\n", "    max_attempts: 2\n    retry_budget: {unlimited: true}\n", "unlimited",
		"no retry budget with max_attempts 2"},
	{"retries on a route that is not idempotent", "    idempotency_keys: true\n", "    idempotency_keys: false\n", "{method: POST",
		"POST /v1/charges is not idempotent and idempotency_keys is off"},
	{"attempts exceed the deadline", "    deadline: 3500ms\n", "    deadline: 2s\n", "deadline: 2s",
		"is 2s, but 2 attempts of attempt_timeout 1.5s"},
	{"timeout over 10 s", "    attempt_timeout: 300ms\n", "    attempt_timeout: 11s\n", "attempt_timeout: 11s",
		"is 11s, over 10s"},
	{"downstream longer than its caller", "    deadline: 500ms\n", "    deadline: 4s\n", "calls: [catalog]",
		"catalog may take up to 4s, longer than its caller pricing waits (3s)"},
	{"retries at two tiers", "    max_attempts: 1\n", "    max_attempts: 2\n", "max_attempts: 2\n    attempt_timeout: 300ms",
		"retries at 2 tiers of the chain pricing -> catalog"},
	{"policy not idempotent", "    idempotent: true\n", "    idempotent: false\n", "  max_attempts: 3",
		"is 3 but idempotent is not true"},
	{"grpc route not idempotent", "Reserve, idempotent: true}", "Reserve}", "Reserve}",
		"/inventory.v1.Reservations/Reserve is not in idempotent_methods, yet max_attempts is 3"},
	{"grpc route not listed", "[/inventory.v1.Stock/]", "[/inventory.v1.Stock/List]", "{method: /inventory.v1.Stock/Get}",
		"/inventory.v1.Stock/Get is not in idempotent_methods"},
	{"grpc timeout over 10 s", "    attempt_timeout: 250ms\n", "    attempt_timeout: 12s\n", "attempt_timeout: 12s",
		"is 12s, over 10s"},
	{"grpc attempts exceed the deadline", "    attempt_timeout: 250ms\n", "    attempt_timeout: 250ms\n    deadline: 550ms\n", "deadline: 550ms",
		"is 550ms, but 3 attempts of attempt_timeout 250ms"},
	{"grpc without a retry budget", "    max_buffered_messages: 16\n", "    max_buffered_messages: 16\n    retry_budget: {unlimited: true}\n", "unlimited",
		"no retry budget with max_attempts 3"},
	{"grpc breaker without minimum", "      consecutive_failures: 5\n", "      consecutive_failures: 5\n      min_requests: 1\n", "min_requests: 1",
		"one early failure opens the breaker"},
	{"grpc retries at two tiers", "    max_buffered_messages: 16\n", "    max_buffered_messages: 16\n    calls: [pricing]\n", "  max_attempts: 3",
		"retries at 2 tiers of the chain inventory -> pricing"},
	{"hedges more than twice", "      max_hedges: 1\n", "      max_hedges: 3\n", "max_hedges: 3",
		"is 3: a slow moment sends up to 4 copies of each call"},
	{"hedge without a retry budget", "    owner: team-pricing\n", "    owner: team-pricing\n    retry_budget: {unlimited: true}\n", "unlimited",
		"no retry budget, yet hedge is set: each hedge spends a budget token"},
	{"hedge on a policy not idempotent", "    idempotent: true\n    throttle: {}", "    idempotent: false\n    hedge: {delay: 100ms}\n    throttle: {}", "hedge: {delay: 100ms}",
		"is set but idempotent is not true: only idempotent calls are hedged"},
	{"hedge on an http dependency whose routes are not hedged", "{method: GET, path: /v1/prices}", "{method: POST, path: /v1/prices, idempotent: true}", "    hedge:\n",
		"is set but no route of pricing is hedged: guardhttp hedges only GET, HEAD, OPTIONS, PUT and DELETE requests"},
	{"hedge on a route that is not idempotent", "{method: GET, path: /v1/prices}", "{method: PUT, path: /v1/prices, idempotent: false}", "{method: PUT",
		"PUT /v1/prices says idempotent: false, yet pricing hedges: guardhttp hedges a PUT by its method"},
	{"throttle k below 1.5", "      k: 2 ", "      k: 1.2 ", "k: 1.2",
		"is 1.2, below 1.5: the throttle rejects requests locally as soon as fewer than 83 % of them are accepted"},
	{"throttle k of 1", "      k: 2 ", "      k: 1 ", "k: 1 ",
		"is 1, below 1.5"},
	{"grpc hedge without idempotent methods", "    idempotent_methods: [/inventory.v1.Stock/]   # every method of the Stock service\n", "", "hedge: {delay: 150ms}",
		"is set but idempotent_methods lists no method: guardgrpc hedges only the unary calls of the methods listed there"},
	{"grpc hedge with no route hedged", "    idempotent_methods: [/inventory.v1.Stock/]   # every method of the Stock service\n", "    idempotent_methods: [/inventory.v1.Stock/List]\n", "hedge: {delay: 150ms}",
		"is set but no route of inventory is hedged: guardgrpc hedges only the methods idempotent_methods lists"},
	{"grpc hedge on a route that is not idempotent", "      - {method: /inventory.v1.Stock/Get}\n", "      - {method: /inventory.v1.Stock/Get, idempotent: false}\n", "{method: /inventory.v1.Stock/Get",
		"/inventory.v1.Stock/Get says idempotent: false, yet idempotent_methods covers it and inventory hedges"},
	{"grpc hedge without a retry budget", "    max_buffered_messages: 16\n", "    max_buffered_messages: 16\n    retry_budget: {unlimited: true}\n", "unlimited",
		"no retry budget, yet hedge is set"},
	{"grpc hedges more than twice", "hedge: {delay: 150ms}", "hedge: {delay: 150ms, max_hedges: 4}", "hedge: {delay: 150ms, max_hedges: 4}",
		"is 4: a slow moment sends up to 5 copies of each call"},
	{"grpc throttle k below 1.5", "    max_buffered_messages: 16\n", "    max_buffered_messages: 16\n    throttle: {k: 1.25}\n", "throttle: {k: 1.25}",
		"is 1.25, below 1.5"},
	{"grpc longer than its caller", "    max_buffered_messages: 16\n", "    max_buffered_messages: 16\n    deadline: 6s\n", "calls: [payments, pricing, ledger, inventory]",
		"inventory may take up to 6s, longer than its caller server api waits (5s)"},
}

func TestRiskyCopiesWarn(t *testing.T) {
	for _, tc := range riskyCopies {
		t.Run(tc.name, func(t *testing.T) {
			data, line := mutate(t, tc.old, tc.new, tc.marker)
			c, err := parse("policy.yaml", data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			for _, d := range c.Warnings {
				if d.Line == line && strings.Contains(d.Message, tc.want) {
					return
				}
			}
			t.Errorf("no warning on line %d saying %q; got %v", line, tc.want, c.Warnings)
		})
	}
}

// JSON is YAML to the parser: the same errors, on the same lines.
func TestJSONFileNamesItsLines(t *testing.T) {
	c, err := parse("policy.json", []byte(`{
  "defaults": {"max_attempts": 2},
  "dependencies": {
    "payments": {
      "reason": "slow provider",
      "attempt_timeout": "5"
    },
    "ledger": {"kind": "policy", "reason": "r", "idempotent": true}
  }
}`))
	if err == nil || len(c.Errors) != 1 {
		t.Fatalf("got %v; want one error", err)
	}
	if got, want := c.Errors[0].String(), `policy.json:6: dependencies.payments.attempt_timeout: "5" has no unit; write 5s`; got != want {
		t.Errorf("got %s; want %s", got, want)
	}
	ok, err := parse("policy.json", []byte(`{"dependencies": {"a": {"reason": "r", "attempt_timeout": "500ms"}}}`))
	if err != nil || len(ok.Dependencies) != 1 || ok.Dependencies[0].HTTP.AttemptTimeout.String() != "500ms" {
		t.Errorf("a valid JSON file: %v", err)
	}
}

// An error in the defaults is found once per dependency that inherits it,
// and said once.
func TestDefaultsErrorSaidOnce(t *testing.T) {
	data, line := mutate(t, "  deadline_reserve: 5ms\n", "  deadline_reserve: 5ms\n  throttle: {k: 0.5}\n", "throttle: {k: 0.5}")
	c, err := parse("policy.yaml", data)
	if err == nil {
		t.Fatal("Parse accepted k: 0.5")
	}
	if len(c.Errors) != 1 || c.Errors[0].Line != line || c.Errors[0].Field != "defaults.throttle.k" {
		t.Errorf("got %d errors, %v; want one, on defaults.throttle.k at line %d", len(c.Errors), c.Errors, line)
	}
	for _, w := range c.Warnings {
		if w.Field == "defaults.throttle.k" {
			t.Errorf("an invalid k warns too: %s", w)
		}
	}
}
