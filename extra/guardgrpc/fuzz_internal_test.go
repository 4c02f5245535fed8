package guardgrpc

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/shed"
)

// The metadata parsers read what a peer sends: they must refuse garbage,
// stay in range and agree with strconv.

func FuzzParsePushback(f *testing.F) {
	for _, s := range []string{"0", "300", "-1", "", " 1", "+5", "2147483647", "2147483648", "99999999999", "1e3", "０"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := parsePushback(s)
		if !ok {
			if d != 0 {
				t.Fatalf("ParsePushback(%q) = %v, false; want 0 when refused", s, d)
			}
			return
		}
		if d < 0 || d > (1<<31-1)*time.Millisecond {
			t.Fatalf("ParsePushback(%q) = %v: out of range", s, d)
		}
		// Only plain non-negative decimals are accepted, and they mean
		// what they say.
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 || strings.ContainsAny(s, "+- ") || time.Duration(n)*time.Millisecond != d {
			t.Fatalf("ParsePushback(%q) = %v, true; strconv says %d, %v", s, d, n, err)
		}
	})
}

func FuzzParsePriority(f *testing.F) {
	for _, s := range []string{"critical", "HIGH", "normal", "low", "sheddable", "", "urgent", "critical,low"} {
		f.Add(s, uint8(0))
		f.Add(s, uint8(shed.Critical))
	}
	f.Fuzz(func(t *testing.T, s string, max uint8) {
		p := parsePriority(s, shed.Priority(max))
		cap := shed.Priority(max)
		if cap < shed.Sheddable || cap > shed.Critical {
			cap = shed.Normal
		}
		if p < shed.Sheddable || p > cap {
			t.Fatalf("ParsePriority(%q, %d) = %d, outside [Sheddable, %d]: metadata must never raise a priority past the cap", s, max, p, cap)
		}
		if q, ok := shed.ParsePriority(s); ok && q <= cap && p != q {
			t.Fatalf("ParsePriority(%q, %d) = %d, want %d", s, max, p, q)
		}
	})
}

func FuzzParseAttempt(f *testing.F) {
	for _, s := range []string{"0", "1", " 2 ", "-1", "+1", "999999999", "1000000000", "x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := parseAttempt(s)
		if !ok {
			return
		}
		if n < 0 || n > 999999999 {
			t.Fatalf("ParseAttempt(%q) = %d: out of range", s, n)
		}
		if m, err := strconv.Atoi(strings.TrimSpace(s)); err != nil || m != n {
			t.Fatalf("ParseAttempt(%q) = %d; Atoi says %d, %v", s, n, m, err)
		}
	})
}
