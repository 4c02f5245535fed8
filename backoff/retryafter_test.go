package backoff_test

import (
	"strings"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/backoff"
)

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestParseRetryAfter(t *testing.T) {
	tests := []struct {
		name, in string
		want     time.Duration
		ok       bool
	}{
		{"seconds", "120", 120 * time.Second, true},
		{"zero", "0", 0, true},
		{"spaces", "  5 ", 5 * time.Second, true},
		{"leading zeros", "0007", 7 * time.Second, true},
		{"imf-fixdate", "Mon, 30 Nov 2026 12:00:30 GMT", 30 * time.Second, true},
		{"rfc850", "Monday, 30-Nov-26 12:01:00 GMT", time.Minute, true},
		{"asctime", "Mon Nov 30 12:00:02 2026", 2 * time.Second, true},
		{"date in the past", "Mon, 30 Nov 2026 11:00:00 GMT", 0, true},
		{"huge seconds capped", "99999999999999999999999999999999", 24 * time.Hour, true},
		{"just above cap", "86401", 24 * time.Hour, true},
		{"far date capped", "Fri, 31 Dec 9999 23:59:59 GMT", 24 * time.Hour, true},
		{"empty", "", 0, false},
		{"negative", "-5", 0, false},
		{"plus sign", "+5", 0, false},
		{"fraction", "1.5", 0, false},
		{"unit", "5s", 0, false},
		{"hex", "0x10", 0, false},
		{"garbage", "soon", 0, false},
		{"wrong zone", "Mon, 30 Nov 2026 12:00:30 PST", 0, false},
		{"too long", strings.Repeat("1", 100), 0, false},
		{"nul", "5\x00", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := backoff.ParseRetryAfter(tt.in, now)
			if got != tt.want || ok != tt.ok {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"120", "0", "-1", "Mon, 30 Nov 2026 12:00:30 GMT", "Monday, 30-Nov-26 12:01:00 GMT",
		"Mon Nov 30 12:00:02 2026", "99999999999999999999", "1e9", " 3 ", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := backoff.ParseRetryAfter(s, now)
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, false: a rejected value must yield 0", s, d)
		}
		if d < 0 || d > 24*time.Hour {
			t.Fatalf("ParseRetryAfter(%q) = %v, outside [0, MaxParsedRetryAfter]", s, d)
		}
	})
}

// Two Retry-After fields: the longer wins, whichever comes first. Taking
// the first sent a retry after 1 s to a server whose other field asked for 2 s.
func TestParseRetryAfterValues(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []string
		want time.Duration
		ok   bool
	}{
		{"none", nil, 0, false},
		{"one", []string{"3"}, 3 * time.Second, true},
		{"shorter first", []string{"1", "2"}, 2 * time.Second, true},
		{"longer first", []string{"2", "1"}, 2 * time.Second, true},
		{"date and seconds", []string{"Mon, 30 Nov 2026 12:00:30 GMT", "20"}, 30 * time.Second, true},
		{"invalid ignored", []string{"soon", "1", "-9"}, time.Second, true},
		{"all invalid", []string{"soon", ""}, 0, false},
		{"zero and past date", []string{"0", "Mon, 30 Nov 2026 11:00:00 GMT"}, 0, true},
		{"capped", []string{"1", "999999999"}, 24 * time.Hour, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := backoff.ParseRetryAfterValues(tt.in, now)
			if got != tt.want || ok != tt.ok {
				t.Errorf("ParseRetryAfterValues(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// FuzzParseRetryAfterValues checks, on two fields, that the result is the
// longer of the fields parsed alone and stays within the parsing cap.
func FuzzParseRetryAfterValues(f *testing.F) {
	f.Add("1", "2")
	f.Add("Mon, 30 Nov 2026 12:00:30 GMT", "soon")
	f.Add("", "99999999999999999999")
	f.Add("-1", "\xff")
	f.Fuzz(func(t *testing.T, a, b string) {
		d, ok := backoff.ParseRetryAfterValues([]string{a, b}, now)
		da, oka := backoff.ParseRetryAfter(a, now)
		db, okb := backoff.ParseRetryAfter(b, now)
		if ok != (oka || okb) {
			t.Fatalf("ParseRetryAfterValues(%q, %q) ok = %v; alone %v and %v", a, b, ok, oka, okb)
		}
		if d != max(da, db) {
			t.Fatalf("ParseRetryAfterValues(%q, %q) = %v; want the longer of %v and %v", a, b, d, da, db)
		}
		if d < 0 || d > 24*time.Hour {
			t.Fatalf("ParseRetryAfterValues(%q, %q) = %v, outside [0, MaxParsedRetryAfter]", a, b, d)
		}
		if d2, _ := backoff.ParseRetryAfterValues([]string{b, a}, now); d2 != d {
			t.Fatalf("order matters: %v then %v", d, d2)
		}
	})
}
