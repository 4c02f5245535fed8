package fault

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// fuzzBody is a body of n bytes that never repeats within a window, so a
// prefix check catches reordered or duplicated bytes.
func fuzzBody(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// writeSizes cuts total into pieces whose sizes come from sizes (cycled),
// scaled by scale.
func writeSizes(total int, sizes []byte, scale uint16) []int {
	if len(sizes) == 0 {
		sizes = []byte{255}
	}
	var out []int
	for i, left := 0, total; left > 0; i++ {
		n := min(int(sizes[i%len(sizes)])*(int(scale)+1)+1, left)
		out = append(out, n)
		left -= n
	}
	return out
}

// FuzzTruncWriter: whatever the handler writes, and however it splits it,
// the client gets the expected prefix and never the whole body, and the
// writer never holds more than truncWindow bytes.
func FuzzTruncWriter(f *testing.F) {
	f.Add(uint32(0), false, uint32(100), []byte{9}, uint16(0))
	f.Add(uint32(10), false, uint32(3*truncWindow), []byte{255, 1, 7}, uint16(64))
	f.Add(uint32(1<<20), false, uint32(truncWindow+1), []byte{0}, uint16(1000))
	f.Add(uint32(0), true, uint32(truncWindow*2), []byte{3}, uint16(300))
	f.Add(uint32(5), false, uint32(0), []byte{}, uint16(0))
	f.Add(uint32(truncWindow), false, uint32(truncWindow), []byte{255}, uint16(65535))
	f.Fuzz(func(t *testing.T, cut uint32, declare bool, total uint32, sizes []byte, scale uint16) {
		total %= 4 * truncWindow
		tr := Truncate{Bytes: int(cut % (8 * truncWindow))}
		body := fuzzBody(int(total))
		rec := httptest.NewRecorder()
		if declare && total > 0 {
			rec.Header().Set("Content-Length", strconv.Itoa(int(total)))
		}
		tw := &truncWriter{w: rec, rc: http.NewResponseController(rec), t: tr}
		off := 0
		for _, n := range writeSizes(int(total), sizes, scale) {
			m, err := tw.Write(body[off : off+n])
			if m < 0 || m > n || (err == nil && m != n) {
				t.Fatalf("Write of %d = %d, %v", n, m, err)
			}
			if len(tw.buf) > truncWindow {
				t.Fatalf("holding %d bytes", len(tw.buf))
			}
			off += n // a proxy stops at the first error; a handler may go on
		}
		tw.finish()

		var want int64
		wantCL := ""
		switch n := int64(total); {
		case declare && n > 0:
			want, wantCL = tr.cut(n), strconv.FormatInt(n, 10)
		case n <= truncWindow:
			want, wantCL = tr.cut(n), strconv.FormatInt(max(n, 1), 10)
		default:
			room := int64(tr.Bytes)
			if room == 0 {
				room = truncWindow / 2
			}
			want = min(room, n-1)
		}
		got := rec.Body.Bytes()
		if int64(len(got)) != want || !bytes.Equal(got, body[:len(got)]) {
			t.Fatalf("sent %d bytes (prefix %v), want %d of %d", len(got), bytes.Equal(got, body[:min(len(got), len(body))]), want, total)
		}
		if cl := rec.Header().Get("Content-Length"); cl != wantCL {
			t.Fatalf("Content-Length = %q, want %q", cl, wantCL)
		}
	})
}

// FuzzTruncStream: the client-side cut of a body of unknown length, read
// in pieces of any size, gives the expected prefix and io.ErrUnexpectedEOF.
func FuzzTruncStream(f *testing.F) {
	f.Add(uint32(0), uint32(3*truncWindow), []byte{9}, uint16(0))
	f.Add(uint32(10), uint32(truncWindow+1), []byte{0, 255}, uint16(100))
	f.Add(uint32(1<<20), uint32(truncWindow+5), []byte{1}, uint16(3))
	f.Add(uint32(0), uint32(50), []byte{}, uint16(0))
	f.Fuzz(func(t *testing.T, cut uint32, total uint32, sizes []byte, scale uint16) {
		total %= 4 * truncWindow
		tr := Truncate{Bytes: int(cut % (8 * truncWindow))}
		body := fuzzBody(int(total))
		resp := &http.Response{Body: io.NopCloser(bytes.NewReader(body)), ContentLength: -1}
		if err := truncateBody(resp, tr); err != nil {
			t.Fatal(err)
		}
		var got []byte
		var err error
		for i := 0; err == nil; i++ {
			size := 1
			if len(sizes) > 0 {
				size = int(sizes[i%len(sizes)])*(int(scale)+1)%(3*truncWindow) + 1
			}
			p := make([]byte, size)
			var n int
			n, err = resp.Body.Read(p)
			got = append(got, p[:n]...)
			if i > 4*truncWindow+10 && n == 0 {
				t.Fatalf("read %d times, %d bytes, without an end", i, len(got))
			}
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("read err = %v, want io.ErrUnexpectedEOF", err)
		}
		n := int64(total)
		want := tr.cut(n)
		if n > truncWindow {
			room := int64(tr.Bytes)
			if room == 0 {
				room = truncWindow / 2
			}
			want = min(room, n-1)
		}
		if int64(len(got)) != want || !bytes.Equal(got, body[:len(got)]) {
			t.Fatalf("read %d bytes, want %d of %d", len(got), want, total)
		}
	})
}
