package fault

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// faultKind names a fault. It is the value of "kind" in a config file, in
// the X-Fault header and in Counter.Kind.
type faultKind string

// The fault kinds, one per Fault type.
const (
	kindLatency      = "latency"       // Latency
	kindError        = "error"         // Status
	kindReset        = "reset"         // Reset
	kindHang         = "hang"          // Hang
	kindSlowBody     = "slow_body"     // SlowBody
	kindStallBody    = "stall_body"    // StallBody
	kindTruncate     = "truncate"      // Truncate
	kindLoseResponse = "lose_response" // LoseResponse
	kindRefuse       = "refuse"        // Refuse
)

// kinds lists every kind in a fixed order (counters of header faults use it).
var kinds = [...]faultKind{kindLatency, kindError, kindReset, kindHang, kindSlowBody,
	kindStallBody, kindTruncate, kindLoseResponse, kindRefuse}

func kindIndex(k faultKind) int {
	for i, x := range kinds {
		if x == k {
			return i
		}
	}
	return -1
}

// Fault is one failure a Rule applies. The implementations are the types of
// this package (Latency, Status, Reset, Hang, SlowBody, StallBody, Truncate,
// LoseResponse, Refuse); the set is closed. Faults are plain values, safe for
// concurrent use.
type Fault interface {
	// kind names the fault.
	kind() faultKind
	// validate reports the first bad field (its config name) and why.
	validate() (field string, err error)
}

// Latency delays the request before anything else happens: before the
// handler runs (server side) or before the request is sent (client side). The
// wait ends early, and the request fails, when its context ends.
//
// Exactly one shape is used, chosen by which fields are set:
//   - fixed: Delay;
//   - uniform: Min (may be zero) to Max, both included;
//   - long tail: P50 and P99, a log-normal distribution with that median and
//     99th percentile, kept within [Min, Max]; a zero Max means 10 × P99.
//
// A zero Latency is invalid.
// Like every Fault, it is a plain value, safe for concurrent use.
type Latency struct {
	Delay    time.Duration // fixed delay; zero means another shape
	Min, Max time.Duration // uniform range, or the bounds of the long tail
	P50, P99 time.Duration // long tail percentiles; zero means not long tail
}

// z99 is the standard normal quantile of 0.99: P99 = P50 · exp(z99 · sigma).
const z99 = 2.3263478740408408

func (Latency) kind() faultKind { return kindLatency }

func (l Latency) validate() (string, error) {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"delay", l.Delay}, {"min", l.Min}, {"max", l.Max}, {"p50", l.P50}, {"p99", l.P99}} {
		if f.d < 0 {
			return f.name, fmt.Errorf("%v is negative", f.d)
		}
	}
	switch {
	case l.Delay > 0:
		if l.Min != 0 || l.Max != 0 || l.P50 != 0 || l.P99 != 0 {
			return "delay", errors.New("a fixed delay takes no min, max, p50 or p99")
		}
	case l.P50 > 0 || l.P99 > 0:
		if l.P50 == 0 {
			return "p50", errors.New("missing (p99 needs p50)")
		}
		if l.P99 < l.P50 {
			return "p99", fmt.Errorf("%v is below p50 %v", l.P99, l.P50)
		}
		if l.Min > l.P50 {
			return "min", fmt.Errorf("%v is above p50 %v", l.Min, l.P50)
		}
		if l.Max != 0 && l.Max < l.P99 {
			return "max", fmt.Errorf("%v is below p99 %v", l.Max, l.P99)
		}
	case l.Max > 0:
		if l.Min > l.Max {
			return "min", fmt.Errorf("%v is above max %v", l.Min, l.Max)
		}
	case l.Min > 0:
		return "max", errors.New("missing (a uniform range needs max)")
	default:
		return "delay", errors.New("missing: set delay, max (with min), or p50 and p99")
	}
	return "", nil
}

// sample draws one delay from rnd, with one draw per call (so a seeded
// source replays the same delays). l must be valid.
func (l Latency) sample(rnd func() float64) time.Duration {
	switch {
	case l.Delay > 0:
		return l.Delay
	case l.P50 > 0:
		hi := l.Max
		if hi == 0 {
			hi = 10 * l.P99
			if hi/10 != l.P99 { // overflow
				hi = math.MaxInt64
			}
		}
		d := float64(l.P50)
		if l.P99 > l.P50 {
			sigma := math.Log(float64(l.P99)/float64(l.P50)) / z99
			d *= math.Exp(sigma * normal(rnd()))
		}
		switch {
		case d >= float64(hi):
			return hi
		case d <= float64(l.Min):
			return l.Min
		}
		return time.Duration(d)
	default:
		// Uniform over [Min, Max], both included: the span has one more
		// value than Max-Min.
		span := l.Max - l.Min
		off := time.Duration(unit(rnd()) * (float64(span) + 1))
		if off < 0 || off > span { // rounding at the top of a huge span
			off = span
		}
		return l.Min + off
	}
}

// normal maps a uniform draw u in [0, 1) to a standard normal one, by the
// inverse of the normal distribution function.
func normal(u float64) float64 {
	// Keep u off 0, where the inverse is -Inf: 2^-53 is the smallest u for
	// which 2u-1 is not -1, about 8.2 standard deviations below the mean.
	u = max(unit(u), 0x1p-53)
	return math.Sqrt2 * math.Erfinv(2*u-1)
}

// unit brings a draw from a Config.Rand that is not in [0, 1) back into it.
func unit(u float64) float64 {
	switch {
	case u >= 0 && u < 1:
		return u
	case u >= 1:
		return math.Nextafter(1, 0)
	}
	return 0 // negative or NaN
}

// Status answers with an HTTP error status instead of running the handler
// (server side) or sending the request (client side).
// Like every Fault, it is a plain value, safe for concurrent use.
type Status struct {
	// Code is the status, 400 to 599 (429, 500, 502, 503, 504 are the usual).
	// Zero means 503.
	Code int
	// RetryAfter, when positive, is sent as a Retry-After header in seconds
	// (rounded up). Zero means no Retry-After unless RetryAfterDate or
	// RetryAfterRaw says otherwise.
	RetryAfter time.Duration
	// RetryAfterDate sends Retry-After as an HTTP-date RetryAfter from now
	// (rounded up to the second) instead of delay-seconds.
	RetryAfterDate bool
	// RetryAfterRaw, when not empty, is sent verbatim as Retry-After, so a
	// client's handling of garbage or negative values can be tested. It
	// excludes RetryAfter and RetryAfterDate.
	RetryAfterRaw string
	// Body is the response body. Empty means the status text and a newline.
	Body string
	// GRPCCode is the code a gRPC call gets, by its name in the gRPC spec
	// ("RESOURCE_EXHAUSTED", "UNAVAILABLE"; any code but OK). Empty means
	// Code mapped as the gRPC spec maps HTTP statuses (see package
	// grpcfault). HTTP traffic ignores it.
	GRPCCode string
}

// grpcCodes are the names of the gRPC status codes other than OK, as the
// gRPC spec writes them.
var grpcCodes = []string{"CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
	"FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
	"UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

func (Status) kind() faultKind { return kindError }

func (s Status) validate() (string, error) {
	if s.Code != 0 && (s.Code < 400 || s.Code > 599) {
		return "status", fmt.Errorf("%d is not an error status (want 400-599)", s.Code)
	}
	if s.GRPCCode != "" && !slices.Contains(grpcCodes, s.GRPCCode) {
		return "grpc_code", fmt.Errorf("%q is not a gRPC error code (want one of %s)",
			s.GRPCCode, strings.Join(grpcCodes, ", "))
	}
	if s.RetryAfter < 0 {
		return "retry_after", fmt.Errorf("%v is negative", s.RetryAfter)
	}
	if s.RetryAfterRaw != "" {
		if s.RetryAfter != 0 || s.RetryAfterDate {
			return "retry_after_raw", errors.New("excludes retry_after and retry_after_date")
		}
		if !validHeaderValue(s.RetryAfterRaw) {
			return "retry_after_raw", fmt.Errorf("%q is not a valid header value", s.RetryAfterRaw)
		}
	}
	return "", nil
}

func (s Status) code() int {
	if s.Code == 0 {
		return http.StatusServiceUnavailable
	}
	return s.Code
}

func (s Status) body() string {
	if s.Body == "" {
		return http.StatusText(s.code()) + "\n"
	}
	return s.Body
}

// retryAfter returns the Retry-After header value at now, or "".
func (s Status) retryAfter(now time.Time) string {
	switch {
	case s.RetryAfterRaw != "":
		return s.RetryAfterRaw
	case s.RetryAfterDate:
		// Round up so a client computing the delay never gets less than asked.
		t := now.Add(s.RetryAfter)
		if t2 := t.Truncate(time.Second); t2.Before(t) {
			t = t2.Add(time.Second)
		}
		return t.UTC().Format(http.TimeFormat)
	case s.RetryAfter > 0:
		secs := (s.RetryAfter + time.Second - 1) / time.Second
		return strconv.FormatInt(int64(secs), 10)
	}
	return ""
}

// header builds the response header of the injected status.
func (s Status) header(now time.Time) http.Header {
	h := http.Header{
		"Content-Type":           {"text/plain; charset=utf-8"},
		"X-Content-Type-Options": {"nosniff"},
		"Content-Length":         {strconv.Itoa(len(s.body()))},
	}
	if v := s.retryAfter(now); v != "" {
		h.Set("Retry-After", v)
	}
	return h
}

// Reset cuts the connection with a TCP reset before any response byte: the
// client sees syscall.ECONNRESET at once, not a timeout. Server side the
// connection is hijacked and closed with SO_LINGER 0 (an HTTP/2 stream is
// reset instead); client side the request is not sent.
// Like every Fault, it is a plain value, safe for concurrent use.
type Reset struct{}

func (Reset) kind() faultKind { return kindReset }

func (Reset) validate() (string, error) { return "", nil }

// Hang never answers: the request is held until the client gives up (its
// context ends or it closes the connection) or the Injector is closed, and
// then the connection is aborted. Nothing outlives the request.
// Like every Fault, it is a plain value, safe for concurrent use.
type Hang struct{}

func (Hang) kind() faultKind { return kindHang }

func (Hang) validate() (string, error) { return "", nil }

// SlowBody delivers the response body Bytes at a time, waiting Every before
// each piece. The status and headers are sent at once.
// Like every Fault, it is a plain value, safe for concurrent use.
type SlowBody struct {
	Bytes int           // bytes per piece; zero means 1
	Every time.Duration // wait before each piece; zero means 100ms
}

func (SlowBody) kind() faultKind { return kindSlowBody }

func (s SlowBody) validate() (string, error) {
	if s.Bytes < 0 {
		return "bytes", fmt.Errorf("%d is negative", s.Bytes)
	}
	if s.Every < 0 {
		return "every", fmt.Errorf("%v is negative", s.Every)
	}
	return "", nil
}

func (s SlowBody) rate() (int, time.Duration) {
	n, every := s.Bytes, s.Every
	if n == 0 {
		n = 1
	}
	if every == 0 {
		every = 100 * time.Millisecond
	}
	return n, every
}

// StallBody sends the status, the headers and the first Bytes of the body,
// then nothing more until the client gives up or the Injector is closed; then
// the connection is aborted.
// Like every Fault, it is a plain value, safe for concurrent use.
type StallBody struct {
	Bytes int // body bytes sent before the stall; zero means none
}

func (StallBody) kind() faultKind { return kindStallBody }

func (s StallBody) validate() (string, error) {
	if s.Bytes < 0 {
		return "bytes", fmt.Errorf("%d is negative", s.Bytes)
	}
	return "", nil
}

// Truncate promises the whole body in Content-Length, sends only part of it
// and closes the connection: the client's read ends in io.ErrUnexpectedEOF.
// At least one byte is always missing (an empty body is announced as one
// byte). A response that cannot carry a body (HEAD, 204, 304) is cut before
// its headers instead.
//
// The body streams: at most 64 KiB of it is ever held. A body of unknown
// length is held up to that much to learn its length; one longer than
// that keeps its unknown length (server side it goes out chunked, without
// its terminating chunk) and is cut at Bytes, or at 32 KiB when Bytes is
// zero. Past the cut the handler's writes fail, so a reverse proxy stops
// reading its upstream.
// Like every Fault, it is a plain value, safe for concurrent use.
type Truncate struct {
	Bytes int // body bytes sent; zero means half the body
}

func (Truncate) kind() faultKind { return kindTruncate }

func (t Truncate) validate() (string, error) {
	if t.Bytes < 0 {
		return "bytes", fmt.Errorf("%d is negative", t.Bytes)
	}
	return "", nil
}

// cut returns how many of n body bytes to send.
func (t Truncate) cut(n int64) int64 {
	c := int64(t.Bytes)
	if c == 0 {
		c = n / 2
	}
	return max(min(c, n-1), 0)
}

// LoseResponse lets the request through and its handler run to completion
// (server side), or the dependency answer in full (client side), then cuts
// the connection with a reset before any byte of the response reaches the
// client. The work is committed but the client sees syscall.ECONNRESET: the
// case idempotency keys exist for.
// Like every Fault, it is a plain value, safe for concurrent use.
type LoseResponse struct{}

func (LoseResponse) kind() faultKind { return kindLoseResponse }

func (LoseResponse) validate() (string, error) { return "", nil }

// Refuse makes the dependency look dead. Client side, the request fails as a
// refused connection (errors.Is(err, syscall.ECONNREFUSED)) without being
// sent. Server side a connection already accepted cannot be refused, so it is
// reset as with Reset; point the client at a DeadServer for a real refusal.
// Like every Fault, it is a plain value, safe for concurrent use.
type Refuse struct{}

func (Refuse) kind() faultKind { return kindRefuse }

func (Refuse) validate() (string, error) { return "", nil }

// validHeaderValue reports whether v can be sent as a header value.
func validHeaderValue(v string) bool {
	return !strings.ContainsFunc(v, func(r rune) bool {
		return r < ' ' && r != '\t' || r == 0x7f
	})
}
