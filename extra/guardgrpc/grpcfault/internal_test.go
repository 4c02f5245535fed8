package grpcfault

import (
	"strings"
	"testing"
)

func TestAuthority(t *testing.T) {
	for target, want := range map[string]string{
		"dns:///pricing.internal:443":        "pricing.internal:443",
		"dns://8.8.8.8/pricing.internal:443": "pricing.internal:443",
		"passthrough:///10.0.0.1:50051":      "10.0.0.1:50051",
		"pricing.internal:443":               "pricing.internal:443",
		"unix:///tmp/sock":                   "tmp/sock",
		"":                                   "",
	} {
		if got := authority(target); got != want {
			t.Errorf("authority(%q) = %q; want %q", target, got, want)
		}
	}
}

// A target is the user's string: authority never panics on it and returns
// a part of it.
func FuzzAuthority(f *testing.F) {
	for _, s := range []string{"dns:///a:1", "://", ":///", "a://b", "x://y/z/w", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		if got := authority(target); !strings.Contains(target, got) {
			t.Fatalf("authority(%q) = %q, not part of it", target, got)
		}
	})
}
