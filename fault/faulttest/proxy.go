package faulttest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards 127.0.0.1:<port> to a target address, so a test can cut a
// client off from a real server (refused connections, reset sockets: a real
// network failure) and restore the path with the server's data intact. It
// is safe for concurrent use.
type Proxy struct {
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener          // nil while down
	conns map[net.Conn]struct{} // open connections, both sides
	wg    sync.WaitGroup        // accept loop and copiers
}

// StartProxy starts a proxy to target and stops it when the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faulttest: %v", err)
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), conns: make(map[net.Conn]struct{})}
	p.serve(ln)
	t.Cleanup(p.Down)
	return p
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.addr }

// Down closes the listener and every open connection: new dials are
// refused and open ones fail. It returns when all proxy goroutines exited.
func (p *Proxy) Down() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Up listens again on the same address.
func (p *Proxy) Up(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatalf("faulttest: relisten on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.forward(c)
		}
	})
}

func (p *Proxy) forward(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // went down meanwhile
		p.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	p.conns[client] = struct{}{}
	p.conns[server] = struct{}{}
	p.mu.Unlock()
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}
	p.wg.Go(func() { pipe(server, client) })
	p.wg.Go(func() { pipe(client, server) })
}
