package lab

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// server is an HTTP server on a loopback port of its own.
type server struct {
	URL string
	srv *http.Server
	ln  net.Listener
	wg  sync.WaitGroup
}

// serve starts h on 127.0.0.1 at a free port.
func serve(h http.Handler) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &server{URL: "http://" + ln.Addr().String(), ln: ln, srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	s.wg.Go(func() { _ = s.srv.Serve(ln) })
	return s, nil
}

// Close stops the server at once, cutting open connections.
func (s *server) Close() {
	_ = s.srv.Close()
	s.wg.Wait()
}

// resetListener is a dependency that is down: it accepts each connection,
// counts it, and resets it at once (SO_LINGER 0), so every call fails fast
// with ECONNRESET and is counted on the dependency's side.
type resetListener struct {
	ln    net.Listener
	Addr  string
	calls atomic.Int64
	wg    sync.WaitGroup
}

func listenReset() (*resetListener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &resetListener{ln: ln, Addr: ln.Addr().String()}
	r.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.calls.Add(1)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
	})
	return r, nil
}

func (r *resetListener) Close() {
	_ = r.ln.Close()
	r.wg.Wait()
}

// closedPort returns a loopback address where nothing listens: connecting
// to it is refused.
func closedPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// countingDialer counts the connections a client attempts.
type countingDialer struct {
	d     net.Dialer
	dials atomic.Int64
}

func (c *countingDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c.dials.Add(1)
	return c.d.DialContext(ctx, network, addr)
}
