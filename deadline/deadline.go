// Package deadline carries a request's deadline across HTTP hops.
//
// The wire format is two headers sent together, so that a receiver whose
// clock disagrees with the caller's still reads the right time left, and a
// log or a proxy still sees when the caller gives up:
//
//	X-Request-Timeout:  <milliseconds left>     relative, immune to clock skew
//	X-Request-Deadline: <unix epoch milliseconds> absolute, for logs and proxies
//
// A receiver trusts the relative header first, clamps what it reads to its own
// maximum (a caller must not make a server work longer than the server allows),
// and keeps a reserve to write its answer.
package deadline

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// Header names of guardrail's wire protocol. This package owns them all, the
// retry header included, so that the client (guardhttp) and the servers
// (deadline, shed) read and write the same names.
const (
	// HeaderTimeout carries the caller's time left, in whole milliseconds.
	HeaderTimeout = "X-Request-Timeout"
	// HeaderDeadline carries the caller's deadline, in unix epoch
	// milliseconds.
	HeaderDeadline = "X-Request-Deadline"
	// HeaderRetryAttempt carries the attempt number of a retry (1 for the
	// first retry); it is absent or 0 on an original request. A server may
	// shed retries before originals (see package shed).
	HeaderRetryAttempt = "X-Retry-Attempt"
)

// maxDigits bounds the numbers read: 15 decimal digits of milliseconds is
// 31,000 years, far past any clamp, and keeps parsing free of overflow.
const maxDigits = 15

// parseTimeout parses an X-Request-Timeout value into the time left, capped
// at limit when limit is positive. It reports false for anything but plain
// decimal digits (no sign, no spaces inside, at most 15 digits): negative,
// fractional, or garbage values are ignored, never trusted.
func parseTimeout(v string, limit time.Duration) (time.Duration, bool) {
	ms, ok := parseMillis(v)
	if !ok {
		return 0, false
	}
	return clamp(millis(ms), limit), true
}

// millis converts ms to a Duration, saturating instead of overflowing (15
// digits of milliseconds exceed the 292 years a Duration holds).
func millis(ms int64) time.Duration {
	if ms > int64(math.MaxInt64/time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// parseDeadline parses an X-Request-Deadline value (epoch ms) into the time
// left at now, capped at limit when limit is positive. A deadline in the past
// yields (0, true): the caller has already given up. Garbage yields false.
func parseDeadline(v string, now time.Time, limit time.Duration) (time.Duration, bool) {
	ms, ok := parseMillis(v)
	if !ok {
		return 0, false
	}
	left := time.UnixMilli(ms).Sub(now)
	if left < 0 {
		left = 0
	}
	return clamp(left, limit), true
}

// FromHeader returns the time left that h announces at now: X-Request-Timeout
// if it parses (whole milliseconds), else X-Request-Deadline (unix epoch
// milliseconds; a deadline past is 0 left), each capped at limit when limit
// is positive. It reports false when neither header holds a valid value:
// garbage, signs, fractions and absurd lengths are ignored, never a panic.
func FromHeader(h http.Header, now time.Time, limit time.Duration) (time.Duration, bool) {
	if d, ok := parseTimeout(h.Get(HeaderTimeout), limit); ok {
		return d, true
	}
	return parseDeadline(h.Get(HeaderDeadline), now, limit)
}

// Set writes both deadline headers into h for a request leaving at now with
// time left d: X-Request-Timeout in whole milliseconds, rounded down, and
// X-Request-Deadline in unix epoch milliseconds. A negative d is sent as 0.
func Set(h http.Header, now time.Time, d time.Duration) {
	d = max(d, 0)
	h.Set(HeaderTimeout, strconv.FormatInt(int64(d/time.Millisecond), 10))
	h.Set(HeaderDeadline, strconv.FormatInt(now.Add(d).UnixMilli(), 10))
}

func parseMillis(v string) (int64, bool) {
	if v == "" || len(v) > maxDigits {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

func clamp(d, limit time.Duration) time.Duration {
	if limit > 0 && d > limit {
		return limit
	}
	return d
}
