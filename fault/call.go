package fault

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// Call is what the rules match a call on when it is not an *http.Request:
// a gRPC call (see package grpcfault) or a plain function call (Wrap). It is
// a plain value; Apply does not keep it.
type Call struct {
	// Method is matched by Match.Methods: "POST" for a gRPC call, empty for
	// a function call (so a rule that names methods never matches one).
	Method string
	// Host is matched by Match.Host. Empty means Metadata(":authority"),
	// a gRPC server's pseudo-header, looked up only when a rule names a
	// host.
	Host string
	// Path is matched by Match.Path: a gRPC call's full method
	// ("/pkg.Service/Method"), a function call's name ("/db/orders.insert").
	Path string
	// Metadata returns the values of a metadata key, given in lower case
	// (a gRPC metadata.MD's Get, or metadata.ValueFromIncomingContext): what
	// Match.Headers is matched on, and what header faults are read from when
	// Config.HeaderFaults is set. Nil means no headers, so a rule that names
	// headers never matches. It is called only during Apply.
	Metadata func(key string) []string
}

// Apply decides the faults of c, as Middleware does for a request, and
// applies those that need no transport: it waits out the summed delay and
// holds a Hang until ctx ends. It returns the fault left for the caller to
// apply (nil, Status, Reset, Refuse, LoseResponse, or a body fault that the
// caller may ignore), or the error that ended the wait: ctx's, or ErrClosed
// when the Injector was closed. A malformed header fault is an error that Is
// ErrInvalidConfig.
//
// Apply is what Wrap and package grpcfault are built on; most callers want
// one of them.
func (in *Injector) Apply(ctx context.Context, c Call) (Fault, error) {
	if in.closed() {
		return nil, nil
	}
	s := in.state.Load()
	if !s.headerFaults && len(s.rules) == 0 {
		return nil, nil
	}
	var values []string
	if s.headerFaults && c.Metadata != nil {
		values = c.Metadata(s.mdHeader)
	}
	ic := call{method: c.Method, host: c.Host, path: c.Path, metadata: c.Metadata}
	p, err := in.decideCall(s, &ic, values)
	if err != nil {
		return nil, err
	}
	if p.delay > 0 {
		if err := in.wait(ctx, p.delay, nil); err != nil {
			return nil, err
		}
	}
	if _, ok := p.fault.(Hang); ok {
		return nil, in.wait(ctx, -1, nil)
	}
	return p.fault, nil
}

// Wrap returns op with the Injector's faults applied to every call, as to a
// call whose Path is name: a rule selects it with match.path ("/db/**"),
// and, since a function call has no method and no headers, not with
// match.methods or match.headers. Write name as a path, from '/'.
//
// Latency waits before op runs (the call fails with ctx's error if ctx ends
// first). Status returns a *StatusError without running op; with a
// RetryAfter it is marked with guardrail.RetryAfterError, so that
// guardrail.Do waits that long before the next attempt (RetryAfterRaw and
// RetryAfterDate mean nothing here). Reset and Refuse return, without
// running op, an error that Is syscall.ECONNRESET or syscall.ECONNREFUSED,
// which guardrail classifies as for a real connection: a refusal is unsent,
// a reset may have reached the dependency. Hang blocks until ctx ends and
// returns ctx's error. LoseResponse runs op to completion, drops what it
// returned and returns a reset: the work is done but the caller cannot
// know it. SlowBody, StallBody and Truncate act on a response body, which a
// function call does not have: the call passes through.
//
// The returned function is safe for concurrent use if op is.
func Wrap[T any](in *Injector, name string, op func(context.Context) (T, error)) func(context.Context) (T, error) {
	return func(ctx context.Context) (T, error) {
		var zero T
		f, err := in.Apply(ctx, Call{Path: name})
		if err != nil {
			return zero, err
		}
		switch f := f.(type) {
		case Status:
			return zero, f.callError()
		case Reset:
			return zero, resetError(name)
		case Refuse:
			return zero, &os.PathError{Op: "dial", Path: name, Err: syscall.ECONNREFUSED}
		case LoseResponse:
			_, _ = op(ctx)
			return zero, resetError(name)
		}
		return op(ctx)
	}
}

// resetError is a connection reset under the call named name.
func resetError(name string) error {
	return &os.PathError{Op: "read", Path: name, Err: syscall.ECONNRESET}
}

// StatusError is the error of an injected Status on a call that has no HTTP
// response to carry it: a function call (Wrap), a gRPC call. It is a plain
// value, not modified after it is returned.
type StatusError struct {
	// Code is the rule's HTTP status, 400 to 599 (503 when the rule left it
	// zero).
	Code int
	// GRPCCode is the rule's gRPC code name ("RESOURCE_EXHAUSTED"), or
	// empty when it named none.
	GRPCCode string
	// RetryAfter is the rule's RetryAfter: zero means no hint.
	RetryAfter time.Duration
}

// Error says which status was injected: "fault: injected status 503
// Service Unavailable".
func (e *StatusError) Error() string {
	if e.GRPCCode != "" {
		return "fault: injected status " + e.GRPCCode
	}
	return fmt.Sprintf("fault: injected status %d %s", e.Code, http.StatusText(e.Code))
}

// callError returns the error a call that is not HTTP gets for s: a
// *StatusError, with the verdict guardhttp's DefaultClassify gives the
// same HTTP answer, so that an injected status is retried, or not, and
// counted by the breaker, or not, as the answer itself would be over
// HTTP (a 404 is the request's own fault: not retried, ignored by the
// breaker), with a RetryAfter waited exactly.
func (s Status) callError() error {
	e := &StatusError{Code: s.code(), GRPCCode: s.GRPCCode, RetryAfter: s.RetryAfter}
	resp := &http.Response{StatusCode: e.Code, Header: make(http.Header, 1)}
	if s.RetryAfter > 0 {
		secs := s.RetryAfter / time.Second
		if s.RetryAfter%time.Second != 0 {
			secs++ // rounded up, as the HTTP fault sends it; without overflow
		}
		resp.Header.Set("Retry-After", strconv.FormatInt(int64(secs), 10))
	}
	v := guardhttp.DefaultClassify(resp, nil)
	if s.RetryAfter > 0 {
		v.RetryAfter = s.RetryAfter // exact, not rounded to the header's seconds
	}
	return guardrail.WithVerdict(e, v)
}
