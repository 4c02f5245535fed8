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
// Values are checked by the constructors of the guardrail packages that
// use them, and their errors are reported on the key that set the field.
// Parse also warns about settings that load but are risky, saying why.
//
// Load returns a Registry of ready values by name: HTTPClient, Policy,
// GRPC, Deadline, Shedder, Idempotency, RateLimiter. They are handles:
// Reload, WatchSignal (SIGHUP) or Watch (the file's modification time)
// swaps their settings atomically for new calls, keeps breakers, budgets,
// bulkheads, throttlers and shedders whose settings did not change, and rejects an
// invalid file as a whole, keeping the settings in force. NewAdmin serves
// their state as JSON and lets an authorised operator force a breaker
// open, closed or reset.
//
// This package does not import gRPC, so that a program using it without
// gRPC does not have gRPC in its module graph: a gRPC dependency's
// settings are core values (GRPCSettings), which package
// extra/grpcconfig, a module of its own, installs on connections as a
// guardgrpc client.
//
// The values are those built by hand from the same numbers:
// Registry.HTTPConfig returns the guardhttp.Config of a client,
// Policy.Current the guardrail.Policy of a dependency, and GRPC.Current
// the fields of a gRPC dependency's guardgrpc.ClientConfig.
package config
