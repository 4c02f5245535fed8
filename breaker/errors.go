package breaker

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ErrOpen is the sentinel every rejection Is: the breaker refused the call
// without running it. errors.As to *OpenError tells when the next probe is
// due.
var ErrOpen = errors.New("breaker: open")

// errTooManyProbes is returned while half-open when every probe slot is
// taken. It Is ErrOpen, but is no *OpenError: the next chance comes when a
// probe reports, so no retry time is known.
var errTooManyProbes error = &rejectError{"breaker: half-open, all probe slots taken"}

type rejectError struct{ msg string }

func (e *rejectError) Error() string        { return e.msg }
func (e *rejectError) Is(target error) bool { return target == ErrOpen }

// OpenError is the rejection of an open breaker. It Is ErrOpen.
//
// One OpenError is made per open period and shared by every call it
// rejects, so rejecting allocates nothing; it is immutable and safe for
// concurrent use.
type OpenError struct {
	// Name is the breaker's Config.Name.
	Name string
	// Until is when the breaker admits its next probe. It is the zero Time
	// when the breaker was forced open: no probe comes until it is reset.
	Until time.Time

	w     uint64 // state word of the open period this error belongs to
	until int64  // Until as the breaker's clock reading
}

// Error says the breaker is open and, when known, until when.
func (e *OpenError) Error() string {
	msg := "breaker: open"
	if e.Name != "" {
		msg = "breaker " + strconv.Quote(e.Name) + ": open"
	}
	if e.Until.IsZero() {
		return msg + " (forced)"
	}
	return msg + " until " + e.Until.Format(time.RFC3339Nano)
}

// Is reports whether target is ErrOpen.
func (e *OpenError) Is(target error) bool { return target == ErrOpen }

// RetryIn returns how long until the next probe is admitted (never
// negative), or 0 when unknown (forced open). It reads the clock; a server
// can turn it into Retry-After.
func (e *OpenError) RetryIn() time.Duration {
	if e.Until.IsZero() {
		return 0
	}
	return max(time.Until(e.Until), 0)
}

// ErrInvalidConfig is the sentinel of every error New and NewGroup return
// for a Config they reject.
var ErrInvalidConfig = errors.New("breaker: invalid config")

// configError reports one invalid field of a Config or GroupConfig. It Is
// ErrInvalidConfig. When several fields are invalid, New returns them
// joined (errors.Join), one per line.
type configError struct {
	field string // as written in Go: "Config.FailureRate"
	value any
	want  string
}

// Error reads "breaker: Config.FailureRate is 1.5; want a value in (0, 1]".
func (e *configError) Error() string {
	return fmt.Sprintf("breaker: %s is %v; want %s", e.field, e.value, e.want)
}

func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }
