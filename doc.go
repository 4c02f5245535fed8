// Package guardrail runs calls to a dependency under one policy of deadlines,
// safe retries, a retry budget, a circuit breaker and a bulkhead.
package guardrail
