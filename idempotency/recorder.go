package idempotency

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
)

// recorder passes the handler's response through to the client as it is
// written, and keeps a copy to store. It copies what the handler wrote, not
// what reached the client: when the connection is cut mid-response the
// stored copy is the complete answer the retry needs.
type recorder struct {
	w        http.ResponseWriter
	status   int         // final status (>= 200), 0 until written
	header   http.Header // the stored fields, copied when status was written
	keep     func(name string) bool
	outer    http.Header // fields set before the handler ran, not stored
	body     bytes.Buffer
	max      int // body bytes kept; negative means no limit
	omitted  bool
	hijacked bool
	hj       hijackKey // settles the key once the connection is taken over
}

// hijackKey is what settling a request's key on a hijack needs, kept in the
// recorder rather than in a closure so that it costs no allocation.
type hijackKey struct {
	m    *Server
	sess *Session
}

func (r *recorder) Header() http.Header { return r.w.Header() }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
		r.header = storedHeader(r.w.Header(), r.keep, r.outer)
	}
	r.w.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !r.omitted && bodyAllowed(r.status) {
		if r.max >= 0 && r.body.Len()+len(p) > r.max {
			r.omitted = true
			r.body = bytes.Buffer{}
		} else {
			r.body.Write(p)
		}
	}
	return r.w.Write(p)
}

// FlushError is found by http.ResponseController before Unwrap.
func (r *recorder) FlushError() error {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(r.w).Flush()
}

// Flush implements http.Flusher for handlers that type-assert it.
func (r *recorder) Flush() { _ = r.FlushError() }

// Hijack records that the handler took the connection: its outcome is
// then unknown, and the key is completed as such (or released, if the
// handler called Release before) before the connection is handed over.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(r.w).Hijack()
	if err == nil && !r.hijacked {
		r.hijacked = true
		if k := r.hj; k.sess != nil {
			k.sess.settle(false, k.m.unknownResponse(), "hijacked")
		}
	}
	return c, rw, err
}

// Unwrap lets http.ResponseController reach the other controls (deadlines,
// full duplex).
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }
