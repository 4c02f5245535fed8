package fault

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Middleware returns a handler that applies the Injector's faults to the
// requests it receives and passes the others to next.
//
// Faults that cut a connection (Reset, Refuse, LoseResponse) hijack it and
// close it with a TCP reset; over HTTP/2, which cannot be hijacked, the
// stream is reset instead. Faults that end a response early (Hang, StallBody,
// Truncate, a delay cut short) abort it by panicking with
// http.ErrAbortHandler, which net/http handles silently: do not put a
// middleware that recovers panics between this one and the server.
//
// A malformed X-Fault header, when header faults are enabled, gets a 400
// naming the problem.
func (in *Injector) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, r, err := in.decide(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		if p.delay > 0 {
			if in.wait(ctx, p.delay, nil) != nil {
				panic(http.ErrAbortHandler)
			}
		}
		switch f := p.fault.(type) {
		case nil:
			next.ServeHTTP(w, r)
		case Status:
			writeStatus(w, f, time.Now())
		case Reset, Refuse:
			reset(w)
		case Hang:
			drain(r)
			_ = in.wait(ctx, -1, nil)
			panic(http.ErrAbortHandler)
		case SlowBody:
			n, every := f.rate()
			sw := &slowWriter{ResponseWriter: w, rc: http.NewResponseController(w),
				in: in, ctx: ctx, bytes: n, every: every}
			next.ServeHTTP(sw, r)
			if sw.err != nil {
				panic(http.ErrAbortHandler)
			}
		case StallBody:
			sw := &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w),
				in: in, r: r, room: f.Bytes}
			next.ServeHTTP(sw, r)
			sw.stall()
			panic(http.ErrAbortHandler)
		case Truncate:
			if r.Method == http.MethodHead {
				reset(w)
				return
			}
			tw := &truncWriter{w: w, rc: http.NewResponseController(w), t: f}
			next.ServeHTTP(tw, r)
			tw.finish()
			panic(http.ErrAbortHandler)
		case LoseResponse:
			next.ServeHTTP(&discardWriter{h: http.Header{}}, r)
			reset(w)
		}
	})
}

func writeStatus(w http.ResponseWriter, s Status, now time.Time) {
	h := w.Header()
	for k, v := range s.header(now) {
		h[k] = v
	}
	w.WriteHeader(s.code())
	_, _ = io.WriteString(w, s.body())
}

// reset hijacks the connection behind w and closes it with a TCP reset, or
// aborts the response when the connection cannot be hijacked.
func reset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	resetConn(conn)
}

// resetConn closes conn with SO_LINGER 0, so the kernel sends RST, not FIN.
func resetConn(conn net.Conn) {
	c := conn
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok { // TLS
		c = nc.NetConn()
	}
	if l, ok := c.(interface{ SetLinger(int) error }); ok {
		_ = l.SetLinger(0)
	}
	_ = c.Close()
}

// drain reads what is left of the request body. net/http watches for the
// client going away (and cancels the request's context) only once the body
// has been read, so a request held with its body unread would outlive its
// client.
func drain(r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
}

// slowWriter writes the body in pieces of bytes, waiting every before each.
type slowWriter struct {
	http.ResponseWriter
	rc          *http.ResponseController
	in          *Injector
	ctx         context.Context
	bytes       int
	every       time.Duration
	wroteHeader bool
	err         error // sticky: the response was cut short
}

func (s *slowWriter) WriteHeader(code int) {
	if code >= 200 {
		s.wroteHeader = true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *slowWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if !s.wroteHeader {
		// Headers go out before the first piece, so sniff the type now.
		if h := s.Header(); h.Get("Content-Type") == "" && len(p) > 0 {
			h.Set("Content-Type", http.DetectContentType(p))
		}
		s.WriteHeader(http.StatusOK)
	}
	n := 0
	for len(p) > 0 {
		_ = s.rc.Flush()
		if err := s.in.wait(s.ctx, s.every, nil); err != nil {
			s.err = err
			return n, err
		}
		m, err := s.ResponseWriter.Write(p[:min(len(p), s.bytes)])
		n += m
		if err != nil {
			s.err = err
			return n, err
		}
		p = p[m:]
	}
	_ = s.rc.Flush()
	return n, nil
}

func (s *slowWriter) Flush() { _ = s.rc.Flush() }

func (s *slowWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

var errStalled = errors.New("fault: response body stalled")

// stallWriter lets room body bytes through, then stalls.
type stallWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	in      *Injector
	r       *http.Request
	room    int
	stalled bool
}

func (s *stallWriter) Write(p []byte) (int, error) {
	if s.stalled {
		return 0, errStalled
	}
	if len(p) < s.room {
		n, err := s.ResponseWriter.Write(p)
		s.room -= n
		return n, err
	}
	n, err := s.ResponseWriter.Write(p[:s.room])
	if err != nil {
		return n, err
	}
	s.stall()
	return n, errStalled
}

// stall sends what was written and waits for the client to give up.
func (s *stallWriter) stall() {
	if s.stalled {
		return
	}
	s.stalled = true
	_ = s.rc.Flush()
	drain(s.r)
	_ = s.in.wait(s.r.Context(), -1, nil)
}

func (s *stallWriter) Flush() {
	if !s.stalled {
		_ = s.rc.Flush()
	}
}

func (s *stallWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

var errTruncated = errors.New("fault: response body truncated")

// truncWindow bounds what a Truncate holds of a body of unknown length
// while it learns whether the body ends: a body that ends within it is
// sent under a Content-Length, a longer one is streamed and cut.
const truncWindow = 64 << 10

// truncWriter sends part of the body under a Content-Length that promises
// all of it. When the handler declares a Content-Length the body streams
// through up to the cut. Otherwise the first truncWindow bytes are held to
// learn the length; a body longer than that goes out chunked, as the
// handler wrote it, and is cut the same way, so memory never follows the
// body's size.
type truncWriter struct {
	w           http.ResponseWriter
	rc          *http.ResponseController
	t           Truncate
	code        int
	wroteHeader bool
	stream      bool  // the headers went out: write through
	room        int64 // stream: bytes left before the cut
	cut         bool  // stream: the cut happened
	chunked     bool  // stream of unknown length: the last byte is held back
	held        [1]byte
	hasHeld     bool   // chunked: held[0] is the last byte written, not sent
	buf         []byte // not streaming: the body so far, at most truncWindow bytes
}

func (t *truncWriter) Header() http.Header { return t.w.Header() }

func (t *truncWriter) WriteHeader(code int) {
	if code < 200 {
		t.w.WriteHeader(code) // informational: pass through
		return
	}
	if t.wroteHeader {
		return
	}
	t.wroteHeader, t.code = true, code
	if !bodyAllowed(code) {
		return
	}
	if n, err := strconv.ParseInt(t.w.Header().Get("Content-Length"), 10, 64); err == nil && n > 0 {
		t.stream, t.room = true, t.t.cut(n)
		t.w.WriteHeader(code)
	}
}

func (t *truncWriter) Write(p []byte) (int, error) {
	if !t.wroteHeader {
		t.WriteHeader(http.StatusOK)
	}
	switch {
	case !bodyAllowed(t.code):
		return 0, http.ErrBodyNotAllowed
	case t.chunked:
		return t.sendHeld(p)
	case t.stream:
		return t.send(p)
	case len(p) <= truncWindow-len(t.buf):
		t.buf = append(t.buf, p...)
		return len(p), nil
	}
	// Longer than the window: the length stays unknown, so stream it.
	t.stream, t.chunked = true, true
	t.room = int64(t.t.Bytes)
	if t.room == 0 {
		t.room = truncWindow / 2 // half of what can be known of the body
	}
	h := t.w.Header()
	h.Del("Content-Length")
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", http.DetectContentType(t.buf))
	}
	t.w.WriteHeader(t.code)
	buf := t.buf
	t.buf = nil
	if _, err := t.sendHeld(buf); err != nil {
		return 0, err
	}
	return t.sendHeld(p)
}

// send writes p through up to the cut. At the cut it flushes what was
// sent, since the handler (a reverse proxy) may abort on the error.
func (t *truncWriter) send(p []byte) (int, error) {
	if t.cut {
		return 0, errTruncated
	}
	if int64(len(p)) < t.room {
		n, err := t.w.Write(p)
		t.room -= int64(n)
		return n, err
	}
	n, err := t.w.Write(p[:t.room])
	t.room -= int64(n)
	t.cut = true
	if err != nil {
		return n, err
	}
	_ = t.rc.Flush()
	return n, errTruncated
}

// sendHeld sends p but holds its last byte back until more comes, so that
// a body which ends before the cut still misses its last byte.
func (t *truncWriter) sendHeld(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if t.hasHeld {
		if _, err := t.send(t.held[:]); err != nil {
			return 0, err
		}
		t.hasHeld = false
	}
	n, err := t.send(p[:len(p)-1])
	if err != nil {
		return n, err
	}
	t.held[0], t.hasHeld = p[len(p)-1], true
	return len(p), nil
}

func (t *truncWriter) Flush() {
	if t.stream && !t.cut {
		_ = t.rc.Flush()
	}
}

// finish sends the truncated response; the caller then aborts the
// connection.
func (t *truncWriter) finish() {
	if !t.wroteHeader {
		t.WriteHeader(http.StatusOK)
	}
	switch {
	case !bodyAllowed(t.code):
		return // cut before the headers
	case t.stream:
		_ = t.rc.Flush()
		return
	}
	body := t.buf
	h := t.w.Header()
	h.Del("Transfer-Encoding")
	h.Set("Content-Length", strconv.Itoa(max(len(body), 1)))
	if h.Get("Content-Type") == "" && len(body) > 0 {
		h.Set("Content-Type", http.DetectContentType(body))
	}
	t.w.WriteHeader(t.code)
	_, _ = t.w.Write(body[:t.t.cut(int64(len(body)))])
	_ = t.rc.Flush()
}

func bodyAllowed(code int) bool {
	return code != http.StatusNoContent && code != http.StatusNotModified
}

// discardWriter takes a whole response and drops it.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}
