package guardgrpc

import (
	"context"
	"errors"
	"reflect"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
)

// hedgedCall is a unary call the engine may hedge. Its attempts may run
// at once, on the caller's goroutine and on the hedges', and a cancelled
// loser may outlive the call: so it is allocated per call, never pooled,
// and every attempt has a trailer, header and peer of its own.
//
// The caller's reply is written by one attempt at a time, the writer:
// the first attempt that starts while no other writes it and no attempt
// has filled it with an answer. Every other attempt decodes into a reply
// of its own, copied into the caller's if it wins. On an unhedged call
// the only attempt is the writer: nothing is copied.
type hedgedCall struct {
	c          *Client
	method     string
	req, reply any
	cc         *grpc.ClientConn
	invoker    grpc.UnaryInvoker
	opts       []grpc.CallOption // the caller's, but its Header, Trailer and Peer options
	headers    []*metadata.MD    // where the caller's grpc.Header options want the header
	trailers   []*metadata.MD    // and its grpc.Trailer options the trailer
	peers      []*peer.Peer      // and its grpc.Peer options the peer

	mu      sync.Mutex
	cond    sync.Cond // broadcast when writing turns false; L is &mu
	n       int       // attempts started
	writing bool      // an attempt is decoding into the caller's reply
	filled  bool      // one did, and succeeded: no other may write it
	ended   bool      // the call is returning: no attempt may start writing

	first hedgeAttempt // the first attempt's, allocated with the call
}

// hedgeAttempt is one attempt of a hedged call: what the call needs of it
// once it won, or once its failure is the call's.
type hedgeAttempt struct {
	reply   any
	writer  bool // reply is the caller's
	header  metadata.MD
	trailer metadata.MD
	peer    peer.Peer
	info    Attempt
	buf     [8]grpc.CallOption
}

// newHedgedCall returns the state of a call that may be hedged, or nil
// when its reply cannot be duplicated (it is not a pointer).
func (c *Client) newHedgedCall(method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) *hedgedCall {
	if !duplicable(reply) {
		return nil
	}
	h := &hedgedCall{c: c, method: method, req: req, reply: reply, cc: cc, invoker: invoker, opts: opts}
	h.cond.L = &h.mu
	for i, o := range opts {
		if !h.capture(o) {
			continue
		}
		// A copy without the options that write the caller's variables:
		// each attempt writes its own, and the one whose answer is
		// returned is copied to the caller's.
		h.opts = append(make([]grpc.CallOption, 0, len(opts)-1), opts[:i]...)
		for _, o := range opts[i+1:] {
			if !h.capture(o) {
				h.opts = append(h.opts, o)
			}
		}
		break
	}
	return h
}

// capture records where o, if it is a grpc.Header, grpc.Trailer or
// grpc.Peer option, wants its value, and reports whether it was one.
func (h *hedgedCall) capture(o grpc.CallOption) bool {
	switch o := o.(type) {
	case grpc.HeaderCallOption:
		h.headers = append(h.headers, o.HeaderAddr)
	case *grpc.HeaderCallOption:
		h.headers = append(h.headers, o.HeaderAddr)
	case grpc.TrailerCallOption:
		h.trailers = append(h.trailers, o.TrailerAddr)
	case *grpc.TrailerCallOption:
		h.trailers = append(h.trailers, o.TrailerAddr)
	case grpc.PeerCallOption:
		h.peers = append(h.peers, o.PeerAddr)
	case *grpc.PeerCallOption:
		h.peers = append(h.peers, o.PeerAddr)
	default:
		return false
	}
	return true
}

// invoke runs the call under the engine's hedging. It returns once no
// attempt writes the caller's reply: losers that write their own may run
// on, cancelled.
func (h *hedgedCall) invoke(ctx context.Context, p *guardrail.Policy, gc guardrail.Call) error {
	won, err := guardrail.DoHedged(ctx, p, gc, h.attempt)
	h.mu.Lock()
	h.ended = true
	for h.writing {
		// A cancelled loser decoding into the caller's reply: it returns
		// promptly, as the invoker honours its context.
		h.cond.Wait()
	}
	h.mu.Unlock()
	a := won
	if err != nil {
		var ae *attemptError
		if errors.As(err, &ae) {
			a = ae.hedge
		}
	} else if !won.writer {
		copyReply(h.reply, won.reply)
	}
	if a != nil {
		for _, p := range h.headers {
			*p = a.header
		}
		for _, p := range h.trailers {
			*p = a.trailer
		}
		for _, p := range h.peers {
			*p = a.peer
		}
	}
	return finish(err)
}

// attempt runs one attempt of a hedged call, maybe at the same time as
// others.
func (h *hedgedCall) attempt(ctx context.Context) (_ *hedgeAttempt, err error) {
	h.mu.Lock()
	h.n++
	n := h.n
	a := &h.first
	if n > 1 {
		a = new(hedgeAttempt)
	}
	if !h.writing && !h.filled && !h.ended {
		h.writing, a.writer = true, true
	}
	h.mu.Unlock()
	if a.writer {
		a.reply = h.reply
		defer func() {
			h.mu.Lock()
			h.writing = false
			h.filled = h.filled || err == nil
			h.cond.Broadcast()
			h.mu.Unlock()
		}()
	} else {
		a.reply = newReply(h.reply)
	}
	ctx = attemptContext(ctx, n)
	opts := append(a.buf[:0], h.opts...)
	opts = append(opts, grpc.Trailer(&a.trailer))
	if len(h.headers) > 0 {
		opts = append(opts, grpc.Header(&a.header))
	}
	if len(h.peers) > 0 {
		opts = append(opts, grpc.Peer(&a.peer))
	}
	if f := h.c.cfg.Attempt; f != nil {
		a.info = Attempt{Method: h.method, Req: h.req, Reply: a.reply, Conn: h.cc, Invoker: h.invoker,
			Idempotent: true, Opts: opts, CallerOpts: opts[:len(h.opts):len(h.opts)]}
		err = f(ctx, &a.info)
		a.info = Attempt{}
	} else {
		err = h.invoker(ctx, h.method, h.req, a.reply, h.cc, opts...)
	}
	if err == nil {
		return a, nil
	}
	if ctx.Err() != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The attempt's own timeout (the engine judges the caller's
			// deadline first): a timeout, as the engine judges one of the
			// caller's attempt, which a hedge's outcome must match for
			// the breaker and the throttle.
			return nil, &attemptError{err: err, v: guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Timeout: true}, hedge: a}
		}
		return nil, err // cancelled: a lost hedge, or the caller gave up
	}
	fa := h.c.failedAttempt(Result{Method: h.method, Err: err, Trailer: a.trailer, Sent: true})
	fa.hedge = a
	return nil, fa
}

// duplicable reports whether a fresh reply like r can be made for an
// attempt of its own: r is a non-nil pointer.
func duplicable(r any) bool {
	v := reflect.ValueOf(r)
	return v.Kind() == reflect.Pointer && !v.IsNil()
}

// newReply returns an empty reply of r's type.
func newReply(r any) any {
	if m, ok := r.(proto.Message); ok {
		return m.ProtoReflect().New().Interface()
	}
	return reflect.New(reflect.TypeOf(r).Elem()).Interface()
}

// copyReply makes dst, the caller's reply, a copy of src, the winner's,
// of the same type.
func copyReply(dst, src any) {
	if m, ok := dst.(proto.Message); ok {
		proto.Reset(m)
		proto.Merge(m, src.(proto.Message))
		return
	}
	reflect.ValueOf(dst).Elem().Set(reflect.ValueOf(src).Elem())
}
