// Package guardgrpc brings guardrail to gRPC: client interceptors that run
// every call under the guardrail retry engine (deadlines, safe retries of
// transient codes, a retry budget, a circuit breaker per target or method,
// an optional bulkhead) and server interceptors that shed load, clamp
// deadlines and deduplicate unary calls by idempotency key.
//
// The client side is a Client built by NewClient; install it with
// Client.DialOptions, which also turns off grpc-go's own service-config
// retries so that retries are never multiplied. The server side is a Server
// built by NewServer; install it with Server.ServerOptions.
//
// The wire vocabulary is gRPC's own where one exists: the deadline travels
// as grpc-timeout, server pushback as the grpc-retry-pushback-ms trailer,
// grpc-go's retry count as grpc-previous-rpc-attempts. Where gRPC has none,
// guardrail's HTTP names are used as metadata keys: x-retry-attempt,
// x-request-priority and idempotency-key.
package guardgrpc
