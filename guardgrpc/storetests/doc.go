// Package storetests runs guardgrpc's idempotency keys against the stores
// that need a server (Redis, PostgreSQL). It is a module of its own so that
// guardgrpc's users do not get go-redis and pgx in their module graph for
// tests they never run.
package storetests
