package breaker

// Outcome is what one call tells the breaker about the dependency's health.
// It is a plain value, safe for concurrent use.
type Outcome uint8

const (
	// Ignored results never count: caller cancellation, 4xx-like errors that
	// say the request was wrong rather than that the dependency is unhealthy.
	Ignored Outcome = iota
	// Success counts as a healthy call (it may still count as slow).
	Success
	// Failure counts against the dependency: timeouts, connection failures,
	// 5xx, 429.
	Failure
)

// String returns "ignored", "success" or "failure".
func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Failure:
		return "failure"
	default:
		return "ignored"
	}
}
