package deadline_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/deadline"
)

var now = time.UnixMilli(1_780_000_000_000)

func TestParseTimeout(t *testing.T) {
	tests := []struct {
		in    string
		limit time.Duration
		want  time.Duration
		ok    bool
	}{
		{"1900", 0, 1900 * time.Millisecond, true},
		{"0", 0, 0, true},
		{"1900", time.Second, time.Second, true},
		{"999999999999999", 5 * time.Second, 5 * time.Second, true},
		{"9999999999999999", 5 * time.Second, 0, false}, // 16 digits: refused, not wrapped
		{"-5", 0, 0, false},
		{"+5", 0, 0, false},
		{" 5", 0, 0, false},
		{"1.5", 0, 0, false},
		{"5ms", 0, 0, false},
		{"", 0, 0, false},
		{strings.Repeat("9", 10000), 0, 0, false},
	}
	for _, tt := range tests {
		got, ok := deadline.ParseTimeoutForTest(tt.in, tt.limit)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseTimeout(%.20q, %v) = %v, %v; want %v, %v", tt.in, tt.limit, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseDeadline(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		limit time.Duration
		want  time.Duration
		ok    bool
	}{
		{"future", epochMillis(now.Add(1500 * time.Millisecond)), 0, 1500 * time.Millisecond, true},
		{"clamped", epochMillis(now.Add(time.Hour)), 10 * time.Second, 10 * time.Second, true},
		{"past", epochMillis(now.Add(-time.Second)), 0, 0, true},
		{"epoch zero", "0", 0, 0, true},
		{"garbage", "tomorrow", 0, 0, false},
		{"negative", "-1", 0, 0, false},
	}
	for _, tt := range tests {
		got, ok := deadline.ParseDeadlineForTest(tt.in, now, tt.limit)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: ParseDeadline(%q) = %v, %v; want %v, %v", tt.name, tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestFromHeaderTrustsRelativeFirst(t *testing.T) {
	h := http.Header{}
	// The absolute deadline comes from a clock 5 s ahead; the relative one is right.
	h.Set(deadline.HeaderDeadline, epochMillis(now.Add(5*time.Second+800*time.Millisecond)))
	h.Set(deadline.HeaderTimeout, "800")
	if got, ok := deadline.FromHeader(h, now, 0); !ok || got != 800*time.Millisecond {
		t.Fatalf("FromHeader = %v, %v; want 800ms from the relative header", got, ok)
	}
	h.Set(deadline.HeaderTimeout, "garbage")
	if got, ok := deadline.FromHeader(h, now, 0); !ok || got != 5800*time.Millisecond {
		t.Fatalf("with a bad relative header FromHeader = %v, %v; want the absolute one", got, ok)
	}
	if _, ok := deadline.FromHeader(http.Header{}, now, 0); ok {
		t.Fatal("FromHeader reported a deadline for a request without one")
	}
}

func TestSetRoundTrips(t *testing.T) {
	h := http.Header{}
	deadline.Set(h, now, 1234567*time.Microsecond)
	if got := h.Get(deadline.HeaderTimeout); got != "1234" {
		t.Errorf("timeout header = %q, want 1234", got)
	}
	if got, ok := deadline.ParseDeadlineForTest(h.Get(deadline.HeaderDeadline), now, 0); !ok || got != 1234*time.Millisecond {
		t.Errorf("deadline header parses back to %v, %v", got, ok)
	}
	deadline.Set(h, now, -time.Second)
	if got := h.Get(deadline.HeaderTimeout); got != "0" {
		t.Errorf("negative time left sent as %q, want 0", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"1900", "0", "-1", "1e3", "99999999999999999999", " 12", "１２", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		const limit = 30 * time.Second
		if d, ok := deadline.ParseTimeoutForTest(s, limit); d < 0 || d > limit || (!ok && d != 0) {
			t.Fatalf("ParseTimeout(%q) = %v, %v", s, d, ok)
		}
		if d, ok := deadline.ParseDeadlineForTest(s, now, limit); d < 0 || d > limit || (!ok && d != 0) {
			t.Fatalf("ParseDeadline(%q) = %v, %v", s, d, ok)
		}
	})
}

// FromHeader reads both headers as untrusted input: whatever they hold, the
// time left is within [0, limit], and a valid relative header wins.
func FuzzFromHeader(f *testing.F) {
	f.Add("1900", "1780000001900")
	f.Add("", "1780000001900")
	f.Add("garbage", "-1")
	f.Add("99999999999999999999", "")
	f.Fuzz(func(t *testing.T, timeout, dl string) {
		const limit = 30 * time.Second
		h := http.Header{deadline.HeaderTimeout: {timeout}, deadline.HeaderDeadline: {dl}}
		d, ok := deadline.FromHeader(h, now, limit)
		if d < 0 || d > limit || (!ok && d != 0) {
			t.Fatalf("FromHeader(%q, %q) = %v, %v", timeout, dl, d, ok)
		}
		if rel, relOK := deadline.ParseTimeoutForTest(timeout, limit); relOK && (!ok || d != rel) {
			t.Fatalf("FromHeader(%q, %q) = %v, %v; want the relative header's %v", timeout, dl, d, ok, rel)
		}
	})
}

// epochMillis formats t as X-Request-Deadline does: unix epoch milliseconds.
func epochMillis(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
