package fault

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Transport returns an http.RoundTripper that applies the Injector's faults
// to the requests it sends and passes the others to base. A nil base means
// http.DefaultTransport. Like every RoundTripper it is safe for concurrent
// use and does not modify the request.
//
// The failures look like the real ones: Reset returns a *net.OpError that Is
// syscall.ECONNRESET, Refuse one that Is syscall.ECONNREFUSED, Hang and an
// interrupted delay return the request context's error, Status returns a
// response without sending the request, LoseResponse sends the request, reads
// the whole response and returns a reset instead. SlowBody, StallBody and
// Truncate act on the response body as it is read; a truncated body ends in
// io.ErrUnexpectedEOF.
func (in *Injector) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{in: in, base: base}
}

type transport struct {
	in   *Injector
	base http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	p, out, err := t.in.decide(req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	ctx := req.Context()
	if p.delay > 0 {
		if err := t.in.wait(ctx, p.delay, nil); err != nil {
			closeBody(req)
			return nil, err
		}
	}
	switch f := p.fault.(type) {
	case nil:
		return t.base.RoundTrip(out)
	case Status:
		closeBody(req)
		h := f.header(time.Now())
		body := f.body()
		code := f.code()
		return &http.Response{
			Status:     strconv.Itoa(code) + " " + http.StatusText(code),
			StatusCode: code,
			Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:        h,
			Body:          io.NopCloser(strings.NewReader(body)),
			ContentLength: int64(len(body)),
			Request:       req,
		}, nil
	case Reset:
		closeBody(req)
		return nil, connError(req, "read", syscall.ECONNRESET)
	case Refuse:
		closeBody(req)
		return nil, connError(req, "dial", syscall.ECONNREFUSED)
	case Hang:
		closeBody(req)
		return nil, t.in.wait(ctx, -1, nil)
	case LoseResponse:
		resp, err := t.base.RoundTrip(out)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body) // let the whole answer arrive, then lose it
		_ = resp.Body.Close()
		return nil, connError(req, "read", syscall.ECONNRESET)
	}
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	switch f := p.fault.(type) {
	case SlowBody:
		n, every := f.rate()
		resp.Body = &slowBody{src: resp.Body, in: t.in, ctx: ctx, bytes: n, every: every,
			stop: make(chan struct{})}
	case StallBody:
		resp.Body = &stallBody{src: resp.Body, in: t.in, ctx: ctx, room: int64(f.Bytes),
			stop: make(chan struct{})}
	case Truncate:
		if err := truncateBody(resp, f); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// connError builds the error a real transport returns when a connection
// fails with errno during op ("dial" or "read").
func connError(req *http.Request, op string, errno syscall.Errno) error {
	call := "read"
	if op == "dial" {
		call = "connect"
	}
	return &net.OpError{Op: op, Net: "tcp", Addr: tcpAddr(canonicalAddr(req)),
		Err: os.NewSyscallError(call, errno)}
}

// tcpAddr is a host:port that need not be resolved.
type tcpAddr string

func (tcpAddr) Network() string  { return "tcp" }
func (a tcpAddr) String() string { return string(a) }

func canonicalAddr(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	host, port := req.URL.Hostname(), req.URL.Port()
	if port == "" {
		port = "80"
		if req.URL.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(host, port)
}

// slowBody reads at most bytes per piece, waiting every before each.
type slowBody struct {
	src   io.ReadCloser
	in    *Injector
	ctx   context.Context
	bytes int
	every time.Duration
	stop  chan struct{}
	once  sync.Once
}

func (b *slowBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return b.src.Read(p)
	}
	if err := b.in.wait(b.ctx, b.every, b.stop); err != nil {
		return 0, err
	}
	return b.src.Read(p[:min(len(p), b.bytes)])
}

func (b *slowBody) Close() error {
	b.once.Do(func() { close(b.stop) })
	return b.src.Close()
}

// stallBody lets room bytes through, then blocks until the reader gives up.
type stallBody struct {
	src  io.ReadCloser
	in   *Injector
	ctx  context.Context
	room int64
	stop chan struct{}
	once sync.Once
}

func (b *stallBody) Read(p []byte) (int, error) {
	if b.room > 0 {
		n, err := b.src.Read(p[:min(int64(len(p)), b.room)])
		b.room -= int64(n)
		if err != io.EOF {
			return n, err
		}
		b.room = 0
		if n > 0 {
			return n, nil
		}
	}
	return 0, b.in.wait(b.ctx, -1, b.stop)
}

func (b *stallBody) Close() error {
	b.once.Do(func() { close(b.stop) })
	return b.src.Close()
}

// truncateBody replaces resp.Body with one that ends early in
// io.ErrUnexpectedEOF. Of a body of unknown length the first truncWindow
// bytes are read to learn the length; a longer body is cut as it streams,
// as the server side does.
func truncateBody(resp *http.Response, t Truncate) error {
	if resp.ContentLength < 0 {
		head, err := io.ReadAll(io.LimitReader(resp.Body, truncWindow+1))
		if err != nil {
			_ = resp.Body.Close()
			return err
		}
		if len(head) > truncWindow {
			room := int64(t.Bytes)
			if room == 0 {
				room = truncWindow / 2
			}
			resp.Body = &truncStream{src: resp.Body, room: room,
				br: bufio.NewReader(io.MultiReader(bytes.NewReader(head), resp.Body))}
			return nil
		}
		_ = resp.Body.Close()
		resp.ContentLength = int64(max(len(head), 1))
		resp.Body = io.NopCloser(bytes.NewReader(head))
	}
	resp.Body = &truncBody{src: resp.Body, room: t.cut(resp.ContentLength)}
	return nil
}

type truncBody struct {
	src  io.ReadCloser
	room int64
}

func (b *truncBody) Read(p []byte) (int, error) {
	if b.room <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	n, err := b.src.Read(p[:min(int64(len(p)), b.room)])
	b.room -= int64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *truncBody) Close() error { return b.src.Close() }

// truncStream cuts a body of unknown length after room bytes. It hands out
// a byte only once the next one has arrived, so a body that ends before
// the cut still misses its last byte.
type truncStream struct {
	src  io.ReadCloser
	br   *bufio.Reader
	room int64
}

func (b *truncStream) Read(p []byte) (int, error) {
	if b.room <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	if b.br.Buffered() < 2 {
		if _, err := b.br.Peek(2); b.br.Buffered() < 2 {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
	n := int(min(int64(len(p)), b.room, int64(b.br.Buffered()-1)))
	n, _ = b.br.Read(p[:n])
	b.room -= int64(n)
	return n, nil
}

func (b *truncStream) Close() error { return b.src.Close() }
