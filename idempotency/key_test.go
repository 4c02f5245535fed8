package idempotency

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", 255)
	tests := []struct {
		name   string
		values []string
		want   string
		err    error
	}{
		{"none", nil, "", ErrNoKey},
		{"sf-string", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"bare", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"surrounding whitespace", []string{" \t\"abc\" "}, "abc", nil},
		{"escapes", []string{`"a\"b\\c"`}, `a"b\c`, nil},
		{"space inside quotes", []string{`"pay order 1"`}, "pay order 1", nil},
		{"max length", []string{long}, long, nil},
		{"max length quoted", []string{`"` + long + `"`}, long, nil},
		{"bare symbols", []string{"pay-o1_x.y~z:1+2/3="}, "pay-o1_x.y~z:1+2/3=", nil},
		{"two fields", []string{"a", "b"}, "", ErrInvalidKey},
		{"folded fields", []string{"a, b"}, "", ErrInvalidKey},
		{"folded quoted", []string{`"a", "b"`}, "", ErrInvalidKey},
		{"empty", []string{""}, "", ErrInvalidKey},
		{"blank", []string{"   "}, "", ErrInvalidKey},
		{"empty quoted", []string{`""`}, "", ErrInvalidKey},
		{"too long", []string{long + "k"}, "", ErrInvalidKey},
		{"too long quoted", []string{`"` + long + `k"`}, "", ErrInvalidKey},
		{"unterminated", []string{`"abc`}, "", ErrInvalidKey},
		{"parameters", []string{`"abc";v=1`}, "", ErrInvalidKey},
		{"bad escape", []string{`"a\nb"`}, "", ErrInvalidKey},
		{"escape at end", []string{`"ab\`}, "", ErrInvalidKey},
		{"control char quoted", []string{"\"a\x01b\""}, "", ErrInvalidKey},
		{"non-ASCII quoted", []string{"\"caf\xc3\xa9\""}, "", ErrInvalidKey},
		{"non-ASCII bare", []string{"caf\xc3\xa9"}, "", ErrInvalidKey},
		{"space in bare", []string{"a b"}, "", ErrInvalidKey},
		{"semicolon in bare", []string{"a;b"}, "", ErrInvalidKey},
		{"quote inside bare", []string{`a"b`}, "", ErrInvalidKey},
		{"backslash in bare", []string{`a\b`}, "", ErrInvalidKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKey(tt.values, 255)
			if !errors.Is(err, tt.err) || (err == nil) != (tt.err == nil) {
				t.Fatalf("ParseKey(%q) error = %v, want %v", tt.values, err, tt.err)
			}
			if got != tt.want {
				t.Errorf("ParseKey(%q) = %q, want %q", tt.values, got, tt.want)
			}
		})
	}
}

// quote renders key as an RFC 8941 sf-string.
func quote(key string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(key) + `"`
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "abc", `"a\"b"`, `"a\\"`, `""`, `"`, `\`,
		`"abc";p=1`, "a, b", " x ", "\"\x7f\"", "\x00", strings.Repeat(`\"`, 300),
	} {
		f.Add(s, 255)
	}
	f.Fuzz(func(t *testing.T, v string, maxLen int) {
		if maxLen < 1 || maxLen > 1<<12 {
			maxLen = 255
		}
		key, err := ParseKey([]string{v}, maxLen)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("error %v does not wrap ErrInvalidKey", err)
			}
			return
		}
		if key == "" || len(key) > maxLen {
			t.Fatalf("accepted key of length %d (max %d)", len(key), maxLen)
		}
		for i := 0; i < len(key); i++ {
			if c := key[i]; c < 0x20 || c > 0x7e {
				t.Fatalf("accepted byte %#x in %q", c, key)
			}
		}
		// The canonical sf-string form parses back to the same key.
		again, err := ParseKey([]string{quote(key)}, maxLen)
		if err != nil || again != key {
			t.Fatalf("round trip of %q: %q, %v", key, again, err)
		}
	})
}

func TestScopedKeyIsUnambiguous(t *testing.T) {
	a := scopedKey([]string{"alice", "POST", "/pay"}, "k1")
	for _, other := range [][4]string{
		{"bob", "POST", "/pay", "k1"},
		{"alice", "PATCH", "/pay", "k1"},
		{"alice", "POST", "/refund", "k1"},
		{"alice", "POST", "/pay", "k2"},
		{"alic", "ePOST", "/pay", "k1"}, // no separator to shift
		{"", "alicePOST", "/pay", "k1"},
	} {
		if b := scopedKey(other[:3], other[3]); b == a {
			t.Errorf("scopedKey%q collides with alice's", other)
		}
	}
	if len(a) != 64 {
		t.Errorf("scoped key length %d, want 64", len(a))
	}
	if a != scopedKey([]string{"alice", "POST", "/pay"}, "k1") {
		t.Error("scopedKey is not deterministic")
	}
}

func TestResponseCodecRoundTrip(t *testing.T) {
	for _, r := range []*Response{
		{Status: 200},
		{Status: 204, Header: http.Header{}},
		{Status: 201, Header: http.Header{"Location": {"/x"}, "X-Multi": {"a", "", "b"}}, Body: []byte{0, 1, 2, 255}},
		{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, BodyOmitted: true},
		{Status: 999, Body: bytes.Repeat([]byte{7}, 70000)},
	} {
		b, err := r.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var got Response
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("UnmarshalBinary: %v", err)
		}
		want := *r
		if len(want.Header) == 0 {
			want.Header = nil
		}
		if !reflect.DeepEqual(&got, &want) {
			t.Errorf("round trip = %+v, want %+v", got, want)
		}
		b2, _ := got.MarshalBinary()
		if !bytes.Equal(b, b2) {
			t.Error("encoding is not deterministic")
		}
	}
}

func TestResponseCodecRejectsCorruption(t *testing.T) {
	good, _ := (&Response{Status: 201, Header: http.Header{"A": {"b"}}, Body: []byte("body")}).MarshalBinary()
	for i := range len(good) {
		var r Response
		if err := r.UnmarshalBinary(good[:i]); err == nil {
			t.Errorf("truncated to %d bytes: no error", i)
		}
	}
	var r Response
	if err := r.UnmarshalBinary(append(good, 0)); err == nil {
		t.Error("trailing byte: no error")
	}
	bad := append([]byte(nil), good...)
	bad[0] = 9
	if err := r.UnmarshalBinary(bad); !errors.Is(err, errCorrupt) {
		t.Errorf("unknown version: %v", err)
	}
}

func FuzzResponseUnmarshal(f *testing.F) {
	good, _ := (&Response{Status: 201, Header: http.Header{"A": {"b", "c"}}, Body: []byte("body")}).MarshalBinary()
	f.Add(good)
	f.Add([]byte{1, 0, 200, 1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Response
		if err := r.UnmarshalBinary(data); err != nil {
			return
		}
		// Whatever decodes re-encodes to the same bytes.
		b, _ := r.MarshalBinary()
		var again Response
		if err := again.UnmarshalBinary(b); err != nil || !reflect.DeepEqual(r, again) {
			t.Fatalf("re-decode: %+v vs %+v, %v", r, again, err)
		}
	})
}
