// Package breaker implements a circuit breaker with a sliding window and
// exact half-open probing.
package breaker
