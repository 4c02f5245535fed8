package shed_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail/shed"
)

func FuzzParseRetryAttempt(f *testing.F) {
	for _, s := range []string{"", "0", "1", " 2 ", "-1", "+3", "1e3", "0x1f", "999999999", "9999999999",
		"١", "1\x00", strings.Repeat("9", 10<<10)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := shed.ParseRetryAttempt(s)
		if !ok && n != 0 {
			t.Errorf("ParseRetryAttempt(%q) = %d, false; want 0 when invalid", s, n)
		}
		if ok && (n < 0 || n > 999999999) {
			t.Errorf("ParseRetryAttempt(%q) = %d, out of range", s, n)
		}
	})
}

func FuzzHeaderPriority(f *testing.F) {
	for _, s := range []string{"", "critical", "CRITICAL", " low ", "normal\x00", "sheddable!", "3", strings.Repeat("a", 10<<10)} {
		f.Add(s, uint8(shed.High))
	}
	f.Fuzz(func(t *testing.T, s string, maxP uint8) {
		h := http.Header{shed.HeaderPriority: {s}}
		p := shed.HeaderPriorityOf(h, shed.Priority(maxP))
		if _, ok := shed.ParsePriority(p.String()); !ok {
			t.Fatalf("HeaderPriorityOf(%q) = %v, not a valid priority", s, p)
		}
		limit := shed.Priority(maxP)
		if _, ok := shed.ParsePriority(limit.String()); !ok {
			limit = shed.Normal
		}
		if p > limit {
			t.Errorf("HeaderPriorityOf(%q, max %v) = %v: escalated past the cap", s, limit, p)
		}
	})
}
