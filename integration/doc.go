// Package integration holds the tests that span several of guardrail's
// modules: gRPC's idempotency keys against the stores that need a server
// (Redis, PostgreSQL), and the copies each module keeps of shared code. It
// is a module of its own that is never published, so no user's module graph
// gets go-redis, pgx and gRPC for tests they never run.
package integration
