package backoff

import (
	"strings"
	"time"
)

// maxParsedRetryAfter is the parsing cap of ParseRetryAfter and
// ParseRetryAfterValues: a longer delay is returned as this one, so an
// absurd header cannot park a client for years nor overflow a Duration.
// It is not a policy: callers apply their own, shorter limit of how long
// they agree to wait (guardrail.Policy.MaxRetryAfter, 30 s by default).
const maxParsedRetryAfter = 24 * time.Hour

// maxRetryAfterLen bounds the input looked at; the longest valid form (an
// RFC 850 date) has 41 bytes.
const maxRetryAfterLen = 64

// The three HTTP-date layouts RFC 9110 section 5.6.7 requires recipients to
// accept. The first is the preferred IMF-fixdate.
var httpDateLayouts = [...]string{
	"Mon, 02 Jan 2006 15:04:05 GMT",
	"Monday, 02-Jan-06 15:04:05 GMT",
	"Mon Jan _2 15:04:05 2006",
}

// ParseRetryAfter parses a Retry-After header value (RFC 9110 section
// 10.2.3): either delay-seconds ("120") or an HTTP-date, which is turned into
// a delay relative to now. It reports false for anything else: garbage,
// negative or fractional numbers, empty values. A date in the past yields
// (0, true): retry now. A delay above 24 hours is capped to 24 hours,
// which no caller waits for anyway. It never panics, and looks at no more than 64 bytes.
//
// A response may carry the header more than once; use
// ParseRetryAfterValues on all of them rather than this on the first.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	value = strings.TrimSpace(value)
	if value == "" || len(value) > maxRetryAfterLen {
		return 0, false
	}
	if c := value[0]; c >= '0' && c <= '9' {
		return parseSeconds(value)
	}
	for _, layout := range httpDateLayouts {
		t, err := time.Parse(layout, value)
		if err != nil {
			continue
		}
		d := t.Sub(now)
		switch {
		case d < 0:
			return 0, true
		case d > maxParsedRetryAfter:
			return maxParsedRetryAfter, true
		}
		return d, true
	}
	return 0, false
}

func parseSeconds(s string) (time.Duration, bool) {
	const limit = int64(maxParsedRetryAfter / time.Second)
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n <= limit { // stop growing once capped: no overflow for any length
			n = n*10 + int64(c-'0')
		}
	}
	if n > limit {
		return maxParsedRetryAfter, true
	}
	return time.Duration(n) * time.Second, true
}

// ParseRetryAfterValues parses every Retry-After field of a response
// (http.Header.Values("Retry-After")) and returns the longest valid delay.
// RFC 9110 allows one field only; a response that sends several is
// ambiguous, and the longest is the safe reading: a client that waits
// longer than asked costs itself a little time, one that retries sooner
// adds load the server asked to be spared. Invalid fields are ignored; it
// reports false when no field is valid. Like ParseRetryAfter it never
// panics and caps at 24 hours.
func ParseRetryAfterValues(values []string, now time.Time) (time.Duration, bool) {
	var longest time.Duration
	found := false
	for _, v := range values {
		if d, ok := ParseRetryAfter(v, now); ok {
			longest, found = max(longest, d), true
		}
	}
	return longest, found
}
