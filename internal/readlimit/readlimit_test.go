package readlimit

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestReadAtMost(t *testing.T) {
	for _, tc := range []struct {
		body  string
		limit int64
		data  string
		over  bool
	}{
		{"", 0, "", false},
		{"abc", 0, "a", true},
		{"abc", 2, "abc", true},
		{"abc", 3, "abc", false},
		{"abc", -1, "abc", false},
		{"abc", math.MaxInt64, "abc", false}, // no wrap to a negative limit
		{"abc", math.MaxInt64 - 1, "abc", false},
	} {
		data, over, err := ReadAtMost(strings.NewReader(tc.body), tc.limit)
		if err != nil || string(data) != tc.data || over != tc.over {
			t.Errorf("ReadAtMost(%q, %d) = %q, %v, %v; want %q, %v", tc.body, tc.limit, data, over, err, tc.data, tc.over)
		}
	}
}

// FuzzReadAtMost: for any body and limit, the data is the body's prefix of
// at most limit+1 bytes, over says whether the body is longer than the
// limit, and nothing overflows.
func FuzzReadAtMost(f *testing.F) {
	f.Add([]byte("abc"), int64(2))
	f.Add([]byte{}, int64(0))
	f.Add([]byte("x"), int64(math.MaxInt64))
	f.Add([]byte("xy"), int64(-5))
	f.Fuzz(func(t *testing.T, body []byte, limit int64) {
		data, over, err := ReadAtMost(bytes.NewReader(body), limit)
		if err != nil {
			t.Fatal(err)
		}
		wantOver := limit >= 0 && int64(len(body)) > limit
		if over != wantOver {
			t.Fatalf("over = %v for %d bytes at limit %d", over, len(body), limit)
		}
		if !bytes.HasPrefix(body, data) {
			t.Fatalf("data %q is not a prefix of the body", data)
		}
		if !over && len(data) != len(body) {
			t.Fatalf("read %d of %d bytes at limit %d, and not over", len(data), len(body), limit)
		}
		if over && int64(len(data)) != limit+1 {
			t.Fatalf("over with %d bytes at limit %d; want limit+1", len(data), limit)
		}
	})
}
