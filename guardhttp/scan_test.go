package guardhttp

import (
	"bytes"
	"slices"
	"testing"
)

// block is the end of a header block and its status code.
type block struct{ end, code int }

// referenceBlocks finds the header blocks of a response as net/textproto
// reads them: lines end in "\n", a final "\r" is dropped, the first line
// of a block is its status line and the first empty line after it ends
// the block.
func referenceBlocks(b []byte) []block {
	var blocks []block
	start, first := 0, true
	for i := 0; i < len(b); {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			break
		}
		line := bytes.TrimSuffix(b[i:i+j], []byte("\r"))
		i += j + 1
		switch {
		case first:
			first = false
		case len(line) == 0:
			end := b[start:i]
			status := end[:min(len(end), 12)]
			if k := bytes.IndexByte(status, '\n'); k >= 0 {
				status = status[:k]
			}
			blocks = append(blocks, block{i, statusCode(status)})
			start, first = i, true
		}
	}
	return blocks
}

// scanBlocks feeds b to a headerScan in pieces of the given sizes (the
// last repeated) and returns the blocks it found.
func scanBlocks(b []byte, sizes []int) []block {
	var h headerScan
	var blocks []block
	off := 0
	for k := 0; off < len(b); k++ {
		size := sizes[min(k, len(sizes)-1)]
		p := b[off:min(off+size, len(b))]
		base := off
		off += len(p)
		for len(p) > 0 {
			n, code, ok := h.next(p)
			if !ok {
				break
			}
			base += n
			p = p[n:]
			blocks = append(blocks, block{base, code})
		}
	}
	return blocks
}

var scanCases = []string{
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 204 No Content\r\n\r\n",
	"HTTP/1.1 200 OK\n\nbody",
	"HTTP/1.1 200 OK\nA: b\n\r\n",
	"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n\r\n",
	"HTTP/1.1 200\r\n\r\n",
	"HTTP/1.1 20",
	"\r\n\r\n",
	"\n\n\n",
	"HTTP/1.1 200 OK\r\nX: \r\r\n\r\n",
	"HTTP/1.1 200 OK\r\n\rX\r\n\r\n",
	"garbage\r\n\r\nHTTP/1.1 500 x\r\n\r\n",
}

// The scanner finds the blocks net/textproto would, however the bytes are
// split across reads.
func TestHeaderScanMatchesTextproto(t *testing.T) {
	for _, c := range scanCases {
		b := []byte(c)
		want := referenceBlocks(b)
		for size := 1; size <= len(b); size++ {
			if got := scanBlocks(b, []int{size}); !slices.Equal(got, want) {
				t.Errorf("%q in pieces of %d: blocks %v, want %v", c, size, got, want)
			}
		}
	}
	if got := referenceBlocks([]byte(scanCases[4])); len(got) != 2 || got[0].code != 103 || got[1].code != 200 {
		t.Errorf("reference finds %v in an interim and a final response", got)
	}
}

func FuzzHeaderScan(f *testing.F) {
	for _, c := range scanCases {
		f.Add([]byte(c), uint8(1), uint8(7))
	}
	f.Fuzz(func(t *testing.T, b []byte, first, rest uint8) {
		sizes := []int{int(first)%64 + 1, int(rest)%64 + 1}
		if got, want := scanBlocks(b, sizes), referenceBlocks(b); !slices.Equal(got, want) {
			t.Fatalf("%q in pieces of %v: blocks %v, want %v", b, sizes, got, want)
		}
	})
}

// BenchmarkHeaderScan is the cost of finding the end of a typical
// response's headers when they arrive in one read.
func BenchmarkHeaderScan(b *testing.B) {
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n" +
		"Date: Mon, 30 Nov 2026 05:35:44 GMT\r\n\r\nok")
	b.SetBytes(int64(len(resp)))
	for b.Loop() {
		var h headerScan
		if _, code, ok := h.next(resp); !ok || code != 200 {
			b.Fatal("no end found")
		}
	}
}
