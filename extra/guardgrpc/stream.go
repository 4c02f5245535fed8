package guardgrpc

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/event"
)

// newStream opens a stream under the engine: opening is retried like a
// unary call whose request was never sent (no message has been sent yet),
// and the stream it returns retries itself until its first response
// message (see clientStream).
func (c *Client) newStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, retriesOff bool, opts []grpc.CallOption) (grpc.ClientStream, error) {
	if c.cfg.Observer != nil && event.Operation(ctx) == "" {
		ctx = event.WithOperation(ctx, method)
	}
	key := c.key(cc, method)
	s := &clientStream{c: c, ctx: ctx, desc: desc, cc: cc, method: method, streamer: streamer, opts: opts}
	s.gc = c.call(cc, key, c.idempotent(ctx, method))
	// A stream outlives its attempt, so no attempt timeout; streams are
	// neither hedged nor throttled.
	s.gc.AttemptTimeout, s.gc.NoThrottle = -1, true
	gc := s.gc
	if grpcRetries(cc, method, retriesOff) {
		gc.MaxAttempts = 1 // grpc-go retries this method itself
	} else {
		s.retryable = s.gc.Idempotent == guardrail.Idempotent && c.maxBuf > 0 && c.maxAttempt > 1
	}
	st, err := guardrail.DoCall(ctx, &c.policy, gc, s.open)
	if err != nil {
		return nil, finish(err)
	}
	s.cur.Store(&streamBox{st})
	if !s.retryable {
		s.committed.Store(true)
	}
	return s, nil
}

// open opens the stream for one attempt of newStream.
func (s *clientStream) open(ctx context.Context) (grpc.ClientStream, error) {
	s.opens++
	ctx = attemptContext(ctx, s.opens)
	st, err := s.streamer(ctx, s.desc, s.cc, s.method, s.opts...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, s.c.failedAttempt(Result{Method: s.method, Err: err})
	}
	return st, nil
}

type streamBox struct{ grpc.ClientStream }

// clientStream is a client stream that, until its first response message,
// keeps the messages sent (up to ClientConfig.MaxBufferedMessages) so that
// a retryable failure of an idempotent stream can be retried on a new
// stream, under the same engine, budget and breaker. Once a response
// message has arrived (or the stream ended, or its buffer overflowed) it is
// committed: it never retries again, and is then a thin pass-through.
//
// As grpc.ClientStream requires, SendMsg and RecvMsg may be called from
// two goroutines at once, but neither from two.
type clientStream struct {
	c         *Client
	ctx       context.Context
	desc      *grpc.StreamDesc
	cc        *grpc.ClientConn
	method    string
	streamer  grpc.Streamer
	opts      []grpc.CallOption
	gc        guardrail.Call
	retryable bool // idempotent, and retries are ours

	cur       atomic.Pointer[streamBox]
	committed atomic.Bool

	mu       sync.Mutex // guards the fields below, and sends against a swap
	opens    int        // streams opened, counting failed openings
	sent     []any      // messages sent, until committed
	overflow bool
	closed   bool // CloseSend called
}

func (s *clientStream) Header() (metadata.MD, error) { return s.cur.Load().Header() }
func (s *clientStream) Trailer() metadata.MD         { return s.cur.Load().Trailer() }
func (s *clientStream) Context() context.Context     { return s.cur.Load().Context() }

// SendMsg sends m, keeping it for a retry until the stream is committed.
// As grpc.ClientStream documents, m must not be modified afterwards. While
// the stream can still be retried, an io.EOF from a stream that failed is
// not returned: the message is kept, and RecvMsg retries or reports the
// failure.
func (s *clientStream) SendMsg(m any) error {
	if s.committed.Load() {
		return s.cur.Load().SendMsg(m)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := !s.committed.Load() && !s.overflow
	if keep {
		if len(s.sent) < s.c.maxBuf {
			s.sent = append(s.sent, m)
		} else {
			s.overflow, s.sent, keep = true, nil, false
		}
	}
	err := s.cur.Load().SendMsg(m)
	if err == io.EOF && keep {
		return nil
	}
	return err
}

// CloseSend closes the sending side, and does so again on a retry.
func (s *clientStream) CloseSend() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.cur.Load().CloseSend()
}

// RecvMsg receives a message; before the first one, a retryable failure
// of an idempotent stream is retried on a new stream.
func (s *clientStream) RecvMsg(m any) error {
	cur := s.cur.Load()
	if s.committed.Load() {
		return cur.RecvMsg(m)
	}
	err := cur.RecvMsg(m)
	if err == nil || err == io.EOF {
		s.commit()
		return err
	}
	if s.ctx.Err() != nil {
		s.commit()
		return err
	}
	return s.retry(m, cur, err)
}

func (s *clientStream) commit() {
	s.committed.Store(true)
	s.mu.Lock()
	s.sent = nil
	s.mu.Unlock()
}

// retry runs the rest of the stream's attempts after the current stream
// failed with err before its first message. The failure already seen is
// the engine's first attempt, so the breaker records it and the backoff or
// pushback comes before the next one.
func (s *clientStream) retry(m any, failed *streamBox, err error) error {
	s.mu.Lock()
	left := s.c.maxAttempt - s.opens + 1
	over := s.overflow
	s.mu.Unlock()
	if over || left < 2 {
		s.commit()
		return err
	}
	seen := s.c.failedAttempt(Result{Method: s.method, Err: err, Trailer: failed.Trailer(), Sent: true})
	var recvErr error
	first := true
	gc := s.gc
	gc.Bulkhead = nil // a slot held while waiting for the first message could starve the others
	gc.MaxAttempts, gc.Observer = left, s.c.resumeObs
	_, derr := guardrail.DoCall(s.ctx, &s.c.policy, gc, func(ctx context.Context) (struct{}, error) {
		if first {
			first = false
			return struct{}{}, seen
		}
		st, err := s.reopen(ctx)
		if err != nil {
			return struct{}{}, err
		}
		if recvErr = st.RecvMsg(m); recvErr == nil || recvErr == io.EOF {
			return struct{}{}, nil
		}
		if ctx.Err() != nil {
			return struct{}{}, recvErr
		}
		return struct{}{}, s.c.failedAttempt(Result{Method: s.method, Err: recvErr, Trailer: st.Trailer(), Sent: true})
	})
	s.commit()
	if derr != nil {
		var ae *attemptError
		var ge *guardrail.Error
		if errors.As(derr, &ae) && ae == seen || errors.As(derr, &ge) && ge.Attempts == 0 {
			return err // no retry was made: the stream's own failure stands
		}
		return finish(derr)
	}
	return recvErr
}

// reopen opens a new stream, sends it what the old one was sent, and makes
// it the current one.
func (s *clientStream) reopen(ctx context.Context) (grpc.ClientStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opens++
	ctx = attemptContext(ctx, s.opens)
	st, err := s.streamer(ctx, s.desc, s.cc, s.method, s.opts...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, s.c.failedAttempt(Result{Method: s.method, Err: err})
	}
	for _, msg := range s.sent {
		if st.SendMsg(msg) != nil {
			break // the stream failed: RecvMsg says how
		}
	}
	if s.closed {
		st.CloseSend()
	}
	s.cur.Store(&streamBox{st})
	return st, nil
}
