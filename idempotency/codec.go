package idempotency

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// errCorrupt is wrapped by UnmarshalBinary's errors.
var errCorrupt = errors.New("idempotency: corrupt stored response")

const (
	codecVersion     = 1
	flagBodyOmitted  = 1 << 0
	maxHeaderEntries = 1 << 16
)

// MarshalBinary encodes r in a compact, versioned binary form (stores that
// keep a response as one value use it). Header names are sorted, so equal
// responses encode to equal bytes.
func (r *Response) MarshalBinary() ([]byte, error) {
	n := 16 + len(r.Body)
	for k, vs := range r.Header {
		n += len(k) + 4
		for _, v := range vs {
			n += len(v) + 4
		}
	}
	b := make([]byte, 0, n)
	var flags byte
	if r.BodyOmitted {
		flags |= flagBodyOmitted
	}
	b = append(b, codecVersion, flags)
	b = binary.AppendUvarint(b, uint64(r.Status))
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		names = append(names, k)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = appendString(b, k)
		vs := r.Header[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	b = appendString(b, string(r.Body))
	return b, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// UnmarshalBinary decodes what MarshalBinary produced. Malformed input gives
// an error, never a panic or a huge allocation.
func (r *Response) UnmarshalBinary(data []byte) error {
	d := decoder{b: data}
	if v := d.byte(); v != codecVersion {
		if d.err != nil {
			return d.err
		}
		return fmt.Errorf("%w: unknown version %d", errCorrupt, v)
	}
	flags := d.byte()
	status := d.uvarint()
	if d.err == nil && (status < 100 || status > 999) {
		return fmt.Errorf("%w: status %d", errCorrupt, status)
	}
	nh := d.count()
	var h http.Header
	if nh > 0 {
		h = make(http.Header, nh)
	}
	for i := 0; i < nh && d.err == nil; i++ {
		k := d.string()
		nv := d.count()
		vs := make([]string, 0, nv)
		for j := 0; j < nv && d.err == nil; j++ {
			vs = append(vs, d.string())
		}
		h[k] = vs
	}
	body := d.string()
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.b))
	}
	*r = Response{Status: int(status), Header: h, BodyOmitted: flags&flagBodyOmitted != 0}
	if body != "" {
		r.Body = []byte(body)
	}
	return nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated %s", errCorrupt, what)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail("header")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("length")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of items each at least one byte long, so it can never
// exceed what is left; that bounds every allocation by the input size.
func (d *decoder) count() int {
	v := d.uvarint()
	if v > uint64(len(d.b)) || v > maxHeaderEntries {
		d.fail("count")
		return 0
	}
	return int(v)
}

func (d *decoder) string() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("string")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
