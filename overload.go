package guardrail

import "errors"

// ErrThrottled: the adaptive throttle rejected the attempt locally, without
// sending it, because the dependency has recently been refusing more than
// it accepted (see throttle.Throttler).
var ErrThrottled = errors.New("guardrail: throttled")

// Overloader is implemented by errors that say the dependency is
// overloaded (an HTTP 429 or 503, a gRPC RESOURCE_EXHAUSTED): hedging stops
// and the throttle does not count the answer as accepted.
type Overloader interface {
	Overload() bool
}

// overloadError marks an error as an overload answer.
type overloadError struct{ err error }

func (e *overloadError) Error() string  { return e.err.Error() }
func (e *overloadError) Unwrap() error  { return e.err }
func (e *overloadError) Overload() bool { return true }

// Overloaded marks err as an answer that says the dependency is
// overloaded, for operations whose errors do not say so themselves. It
// keeps err's verdict (errors.As still finds what err wraps). A nil err
// stays nil.
func Overloaded(err error) error {
	if err == nil {
		return nil
	}
	return &overloadError{err}
}

// isOverload reports whether a failed attempt's error and verdict say the
// dependency is overloaded.
func isOverload(err error, v Verdict) bool {
	if v.RetryAfter > 0 {
		return true
	}
	var o Overloader
	return errors.As(err, &o) && o.Overload()
}
