// Package config reads guardrail policies from a reviewed file and builds
// the values they configure.
//
// A platform team owns the defaults of the shared clients; a service owner
// overrides them per dependency, and every override carries the reason its
// reviewer reads beside it. The file is YAML (or JSON): defaults,
// dependencies (HTTP clients, gRPC clients, or policies for any other
// call, with retries, breakers, bulkheads, hedging and adaptive
// throttling) and servers (deadline, load shedding, idempotency, rate limits).
// Durations have units ("500ms", "2s"), unknown keys are errors, and every
// error names the file, the line, the key, what was found and what is
// allowed:
//
//	policy.yaml:14: dependencies.payments.attempt_timeout: "5" has no unit; write 5s
//
// The file's keys are those of the core's configuration types
// (guardrail.Retry, guardhttp.Config, breaker.Config, shed.Config, ...),
// which declare every setting; the package maps the file onto them in one
// place, and checks the values with the constructors of the guardrail
// packages that use them, reporting their errors on the key that set the
// field. Parse checks a file without building anything, and reports it as
// guardrail check prints it: effective settings, differences from the
// defaults with their reasons, errors, and warnings about settings that
// load but are risky, saying why.
//
// Load returns a Registry of ready values by name: HTTPClient, Policy,
// GRPC, Deadline, Shedder, Idempotency, RateLimiter. They are handles:
// Reload, WatchSignal (SIGHUP) or Watch (the file's modification time)
// swaps their settings atomically for new calls, keeps breakers, budgets,
// bulkheads, throttlers and shedders whose settings did not change, and
// rejects an invalid file as a whole, keeping the settings in force.
// NewAdmin serves their state as JSON and lets an authorised operator
// force a breaker open, closed or reset, behind the core's admin.Guard,
// which refuses what a web page could make a browser send. RangeBreakers
// and RangeBudgets report the breakers and budgets in force, which a
// metrics adapter reads at every scrape (extra/prom's
// Collector.WatchSource).
//
// A policy dependency's handle gives the guardrail.Policy in force to the
// core's functions, so that a call is the core's own:
//
//	ledger, err := reg.Policy("ledger")
//	...
//	ctx, cancel := ledger.WithDeadline(ctx)
//	defer cancel()
//	n, err := guardrail.Do(ctx, ledger.Policy(), op)
//
// This package does not import gRPC, so that a program using it without
// gRPC does not have gRPC in its module graph: a gRPC dependency's
// settings are core values (GRPCSettings), which package
// extra/grpcconfig, a module of its own, installs on connections as a
// guardgrpc client.
//
// The values are those built by hand from the same numbers:
// Registry.HTTPConfig returns the guardhttp.Config of a client,
// PolicyHandle.Policy the guardrail.Policy of a dependency, and
// GRPCHandle.Current the fields of a gRPC dependency's
// guardgrpc.ClientConfig.
package config
