// Package idempotency makes retried POST and PATCH requests safe: HTTP
// middleware that runs a handler once per Idempotency-Key and replays the
// stored response to retries, with a Store interface shared by a fleet.
package idempotency
