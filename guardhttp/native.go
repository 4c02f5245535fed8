package guardhttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// The native path: when the Transport owns its *http.Transport (NewClient)
// and a request goes out in cleartext HTTP/1 without a proxy, the phases
// are bounded without a cancellable context, trace hooks, a copy of the
// request or a runtime timer per request, which together cost more than
// the rest of the guard (see BenchmarkClient's floor and watchdog.go):
//
//   - connect: the dialer's Timeout (DNS included);
//   - write and response header: the connection (guardConn), which sees the
//     request written and the response arrive, keeps the due time of the
//     phase it is in, and which the Transport's watchdog closes when that
//     time passes;
//   - body idle: the attempt, which the watchdog watches while its body is
//     read, and whose body it closes when a Read waits too long.
//
// Each of these fails the round trip with an error of its own shape, which
// nativePhase maps back to the phase, so that the caller gets the same
// *TimeoutError as on the traced path. TLS (where HTTP/2 multiplexes
// requests on one connection), proxies (where the connection is the
// proxy's) and an AttemptTimeout (which spans every phase) take the traced
// path.

// Messages of the response-header timeouts *http.Transport raises itself,
// whose types are not exported. They have not changed since they were
// introduced (Go 1.1 and 1.6); TestBaseTransportTimeoutMessages fails if
// they do.
const (
	msgHeaderTimeout      = "net/http: timeout awaiting response headers"
	msgHTTP2HeaderTimeout = "http2: timeout awaiting response headers"
)

// nativePhase returns the phase whose limit a timeout err of a native
// attempt stands for, or phaseStart if err is none of those. err is known
// to be a timeout. A native attempt's base has no response-header timeout
// and does no TLS: its timeouts are the dialer's and the watchdog's.
func nativePhase(err error) phase {
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch e := e.(type) {
		case *connTimeout: // the watchdog closed the connection
			return e.phase
		case *net.OpError:
			if e.Op == "dial" { // the dialer's Timeout
				return phaseConnect
			}
		}
	}
	return phaseStart
}

// isHeaderTimeout reports whether err is the base transport's own
// ResponseHeaderTimeout expiring, on the traced path.
func isHeaderTimeout(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if m := e.Error(); m == msgHeaderTimeout || m == msgHTTP2HeaderTimeout {
			return true
		}
	}
	return false
}

// connTimeout is the error of the reads and writes of a connection that
// its watchdog closed because the phase it was in ran out of time.
type connTimeout struct{ phase phase }

func (e *connTimeout) Error() string {
	return "guardhttp: " + phaseNames[e.phase] + " timeout: connection closed"
}
func (e *connTimeout) Timeout() bool   { return true }
func (e *connTimeout) Temporary() bool { return true }
func (e *connTimeout) Unwrap() error   { return os.ErrDeadlineExceeded }

// guardDialer returns a DialContext that dials with dial and wraps each
// connection in a guardConn timing its requests' write and response
// header phases under w.
func guardDialer(dial func(context.Context, string, string) (net.Conn, error), w *watchdog, write, header time.Duration) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		gc := &guardConn{Conn: c, w: w, write: write, header: header}
		w.add(gc)
		return gc, nil
	}
}

// States of a guardConn: the low bits of its word.
const (
	connIdle     = iota // between requests, or reading a response body: nothing timed
	connWriting         // a request is being written: write timeout
	connAwaiting        // the request is written: response-header timeout
	connHeaders         // the response headers are arriving: response-header timeout
	connOff             // writes and reads are not ours to time (see guardConn)
	connDead            // the watchdog closed the connection

	stateBits = 3
	stateMask = 1<<stateBits - 1
)

// word packs a state and the time its phase runs out (nanotime; negative:
// a pending marker, see pending; 0: not timed), so that both change
// together and the watchdog acts only on the phase it looked at.
func word(state int, due int64) int64 { return due<<stateBits | int64(state) }

func stateOf(w int64) int { return int(w & stateMask) }
func dueOf(w int64) int64 { return w >> stateBits }
func deadWord(from int, p phase) int64 {
	return int64(from)<<16 | int64(p)<<8 | connDead
}

// guardConn times the requests sent on an HTTP/1 connection and the
// arrival of their responses, for the watchdog to end them:
//
//   - writing: from the first write of a request (for a request with a
//     body, from when the transport hands it the connection: begin) until
//     the request is written, for the write timeout;
//   - awaiting: from then until the first bytes of the response, and
//     headers: until the end of its headers, for the response-header
//     timeout. An interim response (1xx but 101) does not end the wait; a
//     100 Continue starts the writing of the body, under a write timeout
//     of its own.
//
// The end of the headers is found as net/textproto finds it: the first
// empty line, with lines ending in "\n" or "\r\n". A response that comes
// before its request is written (an early answer) ends the write timeout
// too: the rest of the request is no longer waited for, and its last
// writes leave the connection untimed.
//
// When a phase runs out, the watchdog closes the connection, and its
// reads and writes fail with a *connTimeout naming the phase (see Read for
// how the error gets through net/http's reading of the headers). If no
// byte of the response had arrived, the first failed read returns the
// start of a 408 status line before the error: net/http silently sends a
// request
// again when reading a reused connection fails before the first byte of
// the response (it takes the server for one that closed an idle
// connection), which would make the caller wait out the timeout twice; a
// response that starts and then fails is not sent again, and the error is
// the timeout. On a connection that is idle, a 408 is what a server sends
// before closing one, which net/http drops silently.
//
// A connection that carries TLS or HTTP/2 (seen in its first bytes), or
// that was switched to another protocol (101, off), is not timed: its
// writes and reads are records and frames of several requests, or the
// caller's.
type guardConn struct {
	net.Conn
	w      *watchdog
	write  time.Duration // 0: writes are not timed
	header time.Duration // 0: the wait for the response is not timed
	idx    int           // in w.items

	word   atomic.Int64 // state and due time
	starts atomic.Int64 // phases started: their pending markers
	// body: the request being sent has a body, and is written when the
	// transport reports it so (wrote), not when a write returns.
	body atomic.Bool

	// Written by the writing goroutine only (one request at a time).
	sniffed  bool  // the first write was looked at
	writeDue int64 // when the request's write timeout runs out

	// Read by the reading goroutine only (one read at a time).
	scan     headerScan
	injected bool // the 408 was returned
}

func (c *guardConn) slot() *int { return &c.idx }

// h2Preface starts a connection that speaks HTTP/2 without TLS.
var h2Preface = []byte("PRI * HTTP/2")

// pending returns the due time of a phase of limit d that starts now: a
// marker of its own, negative, that the watchdog replaces by the time the
// phase runs out at its next look (see check), or 0 when d means no limit.
// So a phase starts without reading the clock.
func (c *guardConn) pending(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return -c.starts.Add(1)
}

// set moves the connection from the state in old to state, due at due,
// unless another goroutine moved it first, and wakes the watchdog if the
// new phase is timed.
func (c *guardConn) set(old int64, state int, due int64) bool {
	if !c.word.CompareAndSwap(old, word(state, due)) {
		return false
	}
	if due != 0 {
		c.w.wake()
	}
	return true
}

// writing starts the write phase if p is the first write of a request, or
// resumes it if the request is being written in several writes.
func (c *guardConn) writing(p []byte) {
	if !c.sniffed {
		// The first write happens before the connection is shared: the
		// handshake's, or the first request's, ordered before the rest.
		c.sniffed = true
		if len(p) > 0 && (p[0] == 0x16 || bytes.HasPrefix(p, h2Preface)) { // 0x16: a TLS handshake record
			c.word.Store(word(connOff, 0))
			return
		}
	}
	for {
		w := c.word.Load()
		switch stateOf(w) {
		case connIdle:
			if c.body.Load() {
				// The rest of a body whose response already came (an
				// early answer): not a new request, which would have
				// begun (begin) before writing a body.
				return
			}
			c.writeDue = c.pending(c.write) // a new request
		case connAwaiting: // more of the same request
		default: // writing already; the response started (an early answer); off; dead
			return
		}
		if c.set(w, connWriting, c.writeDue) {
			return
		}
	}
}

// written follows a write that returned err. A write that failed because
// the watchdog closed the connection fails with its timeout. One that
// succeeded ends the write phase of a request without a body: the request
// is out, its response awaited.
func (c *guardConn) written(err error) error {
	if err != nil {
		if te, _ := c.timedOut(); te != nil {
			return te
		}
		return err
	}
	if c.body.Load() {
		return nil
	}
	w := c.word.Load()
	if stateOf(w) == connWriting {
		c.writeDue = dueOf(w) // for a next write of the same request
		c.set(w, connAwaiting, c.pending(c.header))
	}
	return nil
}

// begin starts the write phase of a request with a body when the transport
// hands it the connection, before its first write, so that a body slow to
// produce its first bytes is timed too. The request is written when the
// transport says so (wrote).
func (c *guardConn) begin() {
	c.body.Store(true)
	for {
		w := c.word.Load()
		if s := stateOf(w); s == connOff || s == connDead {
			return
		}
		// Whatever the state: an early-answered request may have left it
		// writing or awaiting.
		c.writeDue = c.pending(c.write)
		if c.set(w, connWriting, c.writeDue) {
			return
		}
	}
}

// wrote ends the write phase of a request with a body.
func (c *guardConn) wrote(err error) {
	c.body.Store(false)
	w := c.word.Load()
	if err == nil && stateOf(w) == connWriting {
		c.set(w, connAwaiting, c.pending(c.header))
	}
}

// off stops timing the connection for good: it now carries another
// protocol, whose reads and writes are the caller's.
func (c *guardConn) off() {
	for {
		w := c.word.Load()
		if stateOf(w) == connDead || c.word.CompareAndSwap(w, word(connOff, 0)) {
			return
		}
	}
}

// arrived looks at bytes of a response: the first ones start the headers
// phase, the end of the final headers ends it.
func (c *guardConn) arrived(p []byte) {
	w := c.word.Load()
	switch stateOf(w) {
	case connAwaiting:
		// The response starts, within the time left to the phase.
		if !c.word.CompareAndSwap(w, word(connHeaders, dueOf(w))) {
			c.arrived(p) // the watchdog or the writer moved first
			return
		}
	case connWriting:
		// The response starts before the writer saw its last write return
		// (a fast server), or before the server read all of the request
		// (an early answer, after which the rest is not waited for): its
		// headers have the response-header limit from now.
		if !c.set(w, connHeaders, c.pending(c.header)) {
			c.arrived(p)
			return
		}
	case connHeaders:
	default:
		return
	}
	for len(p) > 0 {
		n, code, ok := c.scan.next(p)
		if !ok {
			return
		}
		p = p[n:]
		switch {
		case code == http.StatusContinue && c.body.Load():
			// The server asks for the body: writing it is timed anew.
			c.toState(connWriting, c.pending(c.write))
		case code >= 100 && code < 200 && code != http.StatusSwitchingProtocols:
			// Another interim response: the final one is still awaited.
		default:
			c.toState(connIdle, 0)
			return
		}
	}
}

// toState moves the connection from a timed phase to state, due at due.
func (c *guardConn) toState(state int, due int64) {
	for {
		w := c.word.Load()
		switch stateOf(w) {
		case connWriting, connAwaiting, connHeaders:
		default:
			return
		}
		if c.set(w, state, due) {
			return
		}
	}
}

// check is the watchdog's look at the connection: it gives a phase that
// started since its last look its due time, closes the connection if its
// phase ran out, and reports whether a phase is timed.
//
// A phase is timed from a clock read after the look that found it
// pending, so from no earlier than its start: a limit never fires early,
// and at most two ticks late. Markers are unique to a phase start, so the
// compare-and-swap cannot stamp a later phase with that earlier time; the
// one marker that comes back, a request written in several writes going
// back to writing, is the same phase.
func (c *guardConn) check(now int64, clock func() int64) bool {
	w := c.word.Load()
	s := stateOf(w)
	if s != connWriting && s != connAwaiting && s != connHeaders {
		return false
	}
	due := dueOf(w)
	switch {
	case due == 0:
		return false
	case due < 0:
		limit := c.header
		if s == connWriting {
			limit = c.write
		}
		c.word.CompareAndSwap(w, word(s, clock()+int64(limit)))
		return true
	case now < due:
		return true
	}
	p := phaseHeader
	if s == connWriting {
		p = phaseWrite
	}
	if !c.word.CompareAndSwap(w, deadWord(s, p)) {
		return true // it moved on: look again next tick
	}
	_ = c.Conn.Close()
	return false
}

// timedOut returns the timeout that closed the connection, and the state
// it was in, if the watchdog closed it.
func (c *guardConn) timedOut() (*connTimeout, int) {
	w := c.word.Load()
	if stateOf(w) != connDead {
		return nil, 0
	}
	return &connTimeout{phase: phase(w >> 8 & 0xff)}, int(w >> 16)
}

// fake408 is what a failed read returns before the error when the response
// had not started (see guardConn).
const fake408 = "HTTP/1.1 408"

func (c *guardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.arrived(p[:n])
	}
	if err == nil {
		return n, nil
	}
	te, from := c.timedOut()
	if te == nil {
		return n, err
	}
	if n > 0 || c.injected {
		return n, te
	}
	switch {
	case (from == connWriting || from == connAwaiting) && len(p) >= len(fake408):
		c.injected = true
		return copy(p, fake408), te
	case from == connHeaders && c.scan.midLine():
		// net/http reads the headers a line at a time with bufio's
		// ReadLine, which returns the piece of a line it holds without
		// the error that followed it: the piece would be parsed as a
		// whole (malformed) line, and the timeout lost. Filling the rest
		// of the buffer makes the piece a prefix instead, and the next
		// read returns the timeout.
		c.injected = true
		for i := range p {
			p[i] = 'x'
		}
		return len(p), nil
	}
	return 0, te
}

func (c *guardConn) Write(p []byte) (int, error) {
	c.writing(p)
	n, err := c.Conn.Write(p)
	return n, c.written(err)
}

// ReadFrom keeps the socket's own ReadFrom (sendfile, splice) for request
// bodies copied from files and sockets.
func (c *guardConn) ReadFrom(r io.Reader) (int64, error) {
	c.writing(nil)
	n, err := io.Copy(c.Conn, r)
	return n, c.written(err)
}

// Close closes the connection and stops watching it.
func (c *guardConn) Close() error {
	c.w.remove(c)
	return c.Conn.Close()
}

// CloseWrite half-closes the connection, for a caller that switched
// protocols (101) and ends its side of the stream.
func (c *guardConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// headerScan finds the ends of the header blocks of a response in the
// pieces a connection reads, and the status code of each. It keeps what it
// needs across pieces: where it stands in the current line, and the start
// of the block's status line.
type headerScan struct {
	inLine    bool     // the current line has started
	cr        bool     // the current line so far is "\r"
	firstDone bool     // the block's status line has ended
	n         int      // bytes of status filled
	status    [12]byte // the start of the block's status line: "HTTP/1.1 200"
}

// midLine reports whether the scan stands inside a line.
func (h *headerScan) midLine() bool { return h.inLine || (!h.firstDone && h.n > 0) }

// next scans p for the end of the current header block: its first empty
// line after the status line. It returns how much of p the block took and
// its status code (0 if its status line is not one), or ok false if p
// ended first.
func (h *headerScan) next(p []byte) (n, code int, ok bool) {
	i := 0
	if !h.firstDone {
		j := bytes.IndexByte(p, '\n')
		if j < 0 {
			h.n += copy(h.status[h.n:], p)
			return 0, 0, false
		}
		h.n += copy(h.status[h.n:], p[:j])
		h.firstDone = true
		i = j + 1
	} else if h.inLine {
		// A line that started in an earlier piece: "\r" so far, ended
		// by "\n", is the empty line.
		if h.cr && len(p) > 0 && p[0] == '\n' {
			return h.end(1)
		}
		j := bytes.IndexByte(p, '\n')
		if j < 0 {
			h.cr = false
			return 0, 0, false
		}
		h.inLine, h.cr = false, false
		i = j + 1
	}
	for i < len(p) {
		// At the start of a line: is it empty, "\n" or "\r\n"?
		switch p[i] {
		case '\n':
			return h.end(i + 1)
		case '\r':
			if i+1 == len(p) {
				h.inLine, h.cr = true, true
				return 0, 0, false
			}
			if p[i+1] == '\n' {
				return h.end(i + 2)
			}
		}
		j := bytes.IndexByte(p[i+1:], '\n') // the line is not empty
		if j < 0 {
			h.inLine = true
			return 0, 0, false
		}
		i += j + 2
	}
	return 0, 0, false
}

// end ends the block n bytes into the current piece.
func (h *headerScan) end(n int) (int, int, bool) {
	code := statusCode(h.status[:h.n])
	*h = headerScan{}
	return n, code, true
}

// statusCode returns the code of a status line that starts with b, or 0.
func statusCode(b []byte) int {
	if len(b) < 12 || !bytes.HasPrefix(b, []byte("HTTP/")) || b[8] != ' ' {
		return 0
	}
	code := 0
	for _, d := range b[9:12] {
		if d < '0' || d > '9' {
			return 0
		}
		code = code*10 + int(d-'0')
	}
	return code
}
