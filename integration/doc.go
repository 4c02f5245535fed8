// Package integration holds the tests that span several of guardrail's
// modules: the gRPC transport's idempotency keys end to end against every
// store (memory, Redis, a Redis Cluster of the tests' own, PostgreSQL),
// the twin of what idempotency/storetest.RunHTTP checks for HTTP in each
// store's own tests; the idempotency benchmarks on those stores; the
// copies each module keeps of shared code; and the type-check of every Go
// block of README.md and docs/, against the packages of every module. It is a module of its own that
// is never published, so no user's module graph gets go-redis, pgx and
// gRPC for tests they never run.
//
// Redis and PostgreSQL are found through GUARDRAIL_TEST_REDIS_ADDR
// (host:port) and GUARDRAIL_TEST_POSTGRES_DSN; their tests skip, saying
// so, when those are unset. The Redis Cluster tests start six
// redis-server processes of their own, and skip when redis-server or
// redis-cli is not on PATH, unless GUARDRAIL_TEST_REDIS_CLUSTER_REQUIRED
// is set.
package integration
