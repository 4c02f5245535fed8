package idempotency

import (
	"math"
	"testing"
	"time"
)

// retryAfterSeconds rounds up without overflowing: the quota's Retry-After
// comes from a store, and d + time.Second - 1 would wrap for the largest
// durations.
func TestRetryAfterSecondsIsOverflowSafe(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{0, "1"}, {-time.Hour, "1"}, {time.Nanosecond, "1"}, {time.Second, "1"},
		{time.Second + 1, "2"}, {24 * time.Hour, "86400"},
		{math.MaxInt64, "9223372037"}, {math.MinInt64, "1"},
	} {
		if got := retryAfterSeconds(tt.d); got != tt.want {
			t.Errorf("retryAfterSeconds(%d) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

// scopeID is the short fixed-size caller ID stores see: 32 hex
// characters, never the caller's name, distinct per caller.
func TestScopeID(t *testing.T) {
	a, b := scopeID("alice"), scopeID("bob")
	if len(a) != 32 || a == b || a == scopeID("") {
		t.Errorf("scopeID: %q, %q", a, b)
	}
	for _, c := range a {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			t.Fatalf("scopeID %q is not hex", a)
		}
	}
}
