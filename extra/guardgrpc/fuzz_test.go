package guardgrpc_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail/idempotency"
)

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\x"`, "a b", "a,b", "", `"`, `"abc"x`, strings.Repeat("k", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, err := idempotency.ParseKey([]string{s}, 255)
		if err != nil {
			if !errorsIs(err, idempotency.ErrInvalidKey) {
				t.Fatalf("ParseKey(%q): %v, not ErrInvalidKey", s, err)
			}
			return
		}
		if key == "" || len(key) > 255 {
			t.Fatalf("ParseKey(%q) = %q: empty or too long", s, key)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: control or non-ASCII byte", s, key)
			}
		}
	})
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
