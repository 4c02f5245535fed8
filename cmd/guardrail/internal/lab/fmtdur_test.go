package lab

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestColText: durations to 3 significant digits in their own unit, their
// names without the _ms their values do not have, and a judged value's
// verdict beside it.
func TestColText(t *testing.T) {
	for _, tc := range []struct {
		col  Col
		want string
	}{
		{Ms("took_ms", 531759339*time.Nanosecond), "took=532ms"},
		{Ms("all_done_at_ms", 32700*time.Millisecond).As("all_done_at", "s"), "all_done_at=32.7s"},
		{Ms("asked_ms", 1259*time.Millisecond).Named("asked"), "asked=1.26s"},
		{Ms("wait_ms", 999600*time.Microsecond), "wait=1s"},
		{Ms("p99_ms", 85*time.Microsecond+400), "p99=85.4µs"},
		{Ms("zero_ms", 0), "zero=0s"},
		{Ms("neg_ms", -1500*time.Millisecond), "neg=-1.5s"},
		{Ms("min_ms", math.MinInt64), "min=-9220000000s"},
		{Col{Key: "converge_ms", Value: nil}, "converge=none"},
		{Float("rate_ms", 1.5, 1), "rate_ms=1.5"}, // a number of ms keeps its unit
		{Float("slower_pct", 17.7, 1).As("vs plain", "%+.1f%%").judgedAs(Fail), "vs plain=+17.7%[FAIL]"},
		{Int("n", 3).judgedAs(NotJudged), "n=3[not judged]"},
	} {
		if got := tc.col.text(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.col.Key, got, tc.want)
		}
	}
}

// FuzzFmtDur: any duration prints, parses back, and is within the rounding
// of 3 significant digits.
func FuzzFmtDur(f *testing.F) {
	for _, d := range []int64{0, 1, 999, 1000, 531759339, 999_600_000, 32_700_000_000, math.MaxInt64, math.MinInt64, -1} {
		f.Add(d)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		d := time.Duration(n)
		s := fmtDur(d)
		back, err := time.ParseDuration(s)
		if err != nil {
			if d == math.MinInt64 || d == math.MaxInt64 || d < -math.MaxInt64/2 || d > math.MaxInt64/2 {
				return // rounded past the range of a Duration: still printed
			}
			t.Fatalf("fmtDur(%d) = %q: %v", n, s, err)
		}
		if diff := math.Abs(float64(back) - float64(d)); diff > math.Abs(float64(d))*0.005+0.5 {
			t.Errorf("fmtDur(%d) = %q, off by %g", n, s, diff)
		}
		if digits := strings.TrimLeft(strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, s), "0"); len(strings.TrimRight(digits, "0")) > 3 {
			t.Errorf("fmtDur(%d) = %q: more than 3 significant digits", n, s)
		}
	})
}
