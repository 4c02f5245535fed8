// Package readlimit reads a body up to a limit, with memory that follows
// the bytes actually read, never the length a peer declared.
package readlimit

import (
	"io"
	"math"
)

// ReadAtMost reads r until EOF or until it has read more than limit bytes,
// and reports whether r held more than limit bytes: then data holds the
// first limit+1 of them (limit of them when limit is math.MaxInt64, which
// no body reaches), and the rest is left in r. A negative limit means no
// limit. The buffer grows with what is read, from a small start, whatever
// length r claims to have.
func ReadAtMost(r io.Reader, limit int64) (data []byte, over bool, err error) {
	if limit < 0 {
		data, err = io.ReadAll(r)
		return data, false, err
	}
	n := limit
	if n < math.MaxInt64 {
		n++ // one byte more tells a body over the limit from one at it
	}
	data, err = io.ReadAll(io.LimitReader(r, n))
	return data, int64(len(data)) > limit, err
}
