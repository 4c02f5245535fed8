package guardhttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// The native path: when the Transport owns its *http.Transport (NewClient)
// and a request goes out in cleartext HTTP/1 without a proxy, the phases
// before the response body are bounded by what net/http and the socket
// enforce themselves. An attempt then needs no cancellable context, no
// trace hooks and no copy of the request, which together cost as much as
// the rest of the guard (see BenchmarkClient's floor):
//
//   - connect: the dialer's Timeout (DNS included);
//   - write: a write deadline on the connection (guardConn), set when the
//     request starts to be written;
//   - response header: the transport's ResponseHeaderTimeout, which
//     starts once the request is written;
//   - body idle: the attempt's timer, as on the traced path, which closes
//     the body instead of cancelling a context.
//
// Each of these fails the round trip with an error of its own shape, which
// nativePhase maps back to the phase, so that the caller gets the same
// *TimeoutError as on the traced path. TLS (where HTTP/2 multiplexes
// requests on one connection), proxies (where the connection is the
// proxy's) and an AttemptTimeout (which spans every phase) take the traced
// path.

// Messages of the timeouts *http.Transport raises itself, whose types are
// not exported. They have not changed since they were introduced (Go 1.1
// and 1.6); TestBaseTransportTimeoutMessages fails if they do.
const (
	msgHeaderTimeout      = "net/http: timeout awaiting response headers"
	msgHTTP2HeaderTimeout = "http2: timeout awaiting response headers"
	msgTLSTimeout         = "net/http: TLS handshake timeout"
)

// nativePhase returns the phase whose limit a timeout err raised by the
// base transport of a native attempt stands for, or phaseStart if err is
// none of those. err is known to be a timeout.
func nativePhase(err error) phase {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if op, ok := e.(*net.OpError); ok {
			switch op.Op {
			case "dial": // the dialer's Timeout
				return phaseConnect
			case "write", "readfrom": // guardConn's deadline; readfrom: a body copied to the socket
				return phaseWrite
			}
			continue
		}
		switch e.Error() {
		case msgHeaderTimeout, msgHTTP2HeaderTimeout:
			return phaseHeader
		case msgTLSTimeout:
			return phaseTLS
		}
	}
	return phaseStart
}

// isHeaderTimeout reports whether err is the base transport's own
// ResponseHeaderTimeout expiring.
func isHeaderTimeout(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if m := e.Error(); m == msgHeaderTimeout || m == msgHTTP2HeaderTimeout {
			return true
		}
	}
	return false
}

// guardDialer returns a DialContext that dials with d and wraps each
// connection in a guardConn bounding the writing of each request to write.
func guardDialer(d *net.Dialer, write time.Duration) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &guardConn{Conn: c, write: write}, nil
	}
}

// States of a guardConn.
const (
	connIdle    int32 = iota // the next write starts a request, and its write timeout
	connWriting              // a request is being written under the write timeout
	connOff                  // writes are not ours to time (see guardConn)
)

// guardConn bounds the time the peer takes to accept a request: a request's
// first write sets a write deadline of its write timeout, and the first
// response bytes end it. An HTTP/1 client writes a request, then reads its
// response, which starts only once the server has the request (or answers
// early, when what is left of the request is no longer waited for); the
// next request starts after the response was read. So the deadline covers
// the whole request, headers and body, however many writes it takes,
// including the time its body takes to produce between them. A request
// with a body starts its timeout when the transport hands it the
// connection (begin), so that a body slow to produce its first bytes is
// timed too. After a 100 Continue, the body has a timeout of its own.
//
// A connection that carries TLS or HTTP/2 (seen in its first bytes), or
// that was switched to another protocol (101, off), is not timed: its
// writes are records and frames of several requests, or the caller's.
//
// The deadline is removed when the response starts, so that no timer
// waits on an idle connection. If the server answers early and the last
// write of the request comes after its response was read, the connection
// goes back to the pool still writing, under that write's deadline: the
// next request with a body starts its own (begin); one without writes its
// few bytes at once, and, were that deadline already past, its write fails
// with nothing written, which *http.Transport retries on a new connection.
type guardConn struct {
	net.Conn
	write   time.Duration
	state   atomic.Int32
	sniffed bool // the first write was looked at; written by the first writer only
}

// h2Preface starts a connection that speaks HTTP/2 without TLS.
var h2Preface = []byte("PRI * HTTP/2")

// starting starts the write timeout if p is the first write of a request.
func (c *guardConn) starting(p []byte) {
	if !c.sniffed {
		// The first write happens before the connection is shared: the
		// handshake's, or the first request's, ordered before the rest.
		c.sniffed = true
		if len(p) > 0 && (p[0] == 0x16 || bytes.HasPrefix(p, h2Preface)) { // 0x16: a TLS handshake record
			c.state.Store(connOff)
			return
		}
	}
	if c.state.CompareAndSwap(connIdle, connWriting) {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.write))
	}
}

// begin starts the write timeout of a request now, before its first write,
// whatever the state: a request whose last write came after its response
// (an early answer) may have left the connection writing.
func (c *guardConn) begin() {
	if c.state.Load() == connOff {
		return
	}
	c.state.Store(connWriting)
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.write))
}

// off stops timing writes for good: the connection now carries another
// protocol, whose writes are the caller's.
func (c *guardConn) off() {
	c.state.Store(connOff)
	_ = c.Conn.SetWriteDeadline(time.Time{})
}

func (c *guardConn) Write(p []byte) (int, error) {
	c.starting(p)
	return c.Conn.Write(p)
}

// ReadFrom keeps the socket's own ReadFrom (sendfile, splice) for request
// bodies copied from files and sockets.
func (c *guardConn) ReadFrom(r io.Reader) (int64, error) {
	c.starting(nil)
	return io.Copy(c.Conn, r)
}

func (c *guardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.state.CompareAndSwap(connWriting, connIdle) {
		_ = c.Conn.SetWriteDeadline(time.Time{})
	}
	return n, err
}

// CloseWrite half-closes the connection, for a caller that switched
// protocols (101) and ends its side of the stream.
func (c *guardConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
