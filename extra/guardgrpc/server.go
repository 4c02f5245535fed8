package guardgrpc

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/shed"
)

// Defaults used for zero ServerConfig fields.
const (
	// defaultMaxTimeout caps the deadline a call may ask the server to
	// work for, and is the deadline of a call that announces none, as the
	// HTTP deadline middleware's default.
	defaultMaxTimeout = 30 * time.Second
	// defaultShedPushback is the pushback sent with a shed call.
	defaultShedPushback = time.Second
)

// ServerConfig configures a Server. The zero value is valid: deadlines
// clamped to defaultMaxTimeout, no shedding, no idempotency keys.
//
// A ServerConfig is a plain value that NewServer reads once, so changing
// it afterwards has no effect, and it is safe to share; the values it
// points to must be safe for concurrent use.
type ServerConfig struct {
	// Shedder, when not nil, admits or sheds every call. Its events
	// (event.Admit, event.Shed) carry the full method as the operation.
	Shedder *shed.Shedder

	// ShedCode is the code of a shed call: codes.Unavailable (the zero
	// value, codes.OK, means it) or codes.ResourceExhausted. Both are
	// retried by guardgrpc clients after the pushback, and UNAVAILABLE by
	// any gRPC client that retries. Any other code is invalid.
	ShedCode codes.Code

	// ShedPushback is the grpc-retry-pushback-ms a shed call's trailer
	// carries: how long the client should wait before retrying. Zero means
	// defaultShedPushback; negative means "do not retry" (a negative
	// pushback), for a server that wants shed calls to fail at once. A
	// call shed by TapHandle carries no trailer (gRPC sends none from
	// there): clients then use their own backoff.
	ShedPushback time.Duration

	// Priority returns a call's priority for shedding (by method, by
	// authenticated caller). It is trusted. Nil means the
	// x-request-priority metadata, capped at MaxPriority.
	Priority func(ctx context.Context, method string) shed.Priority

	// MaxPriority is the highest priority a client may claim with the
	// x-request-priority metadata: zero means shed.Normal, so by default
	// metadata can only lower a call's priority. Ignored when Priority is
	// set. A value above shed.Critical is invalid.
	MaxPriority shed.Priority

	// MaxTimeout caps the deadline a call may ask for, and is the
	// deadline of a call that announces none: a longer grpc-timeout is
	// clamped, so a client cannot make the server work longer than it
	// allows. A call whose deadline has passed is answered
	// DEADLINE_EXCEEDED without running the handler. Zero means
	// defaultMaxTimeout; negative means no cap (and no deadline for calls
	// without one).
	MaxTimeout time.Duration

	// Keys, when not nil, deduplicates unary calls carrying an
	// idempotency-key (see KeyConfig).
	Keys *KeyConfig

	// Observer receives the idempotency events, with the full method as
	// the operation. When it is set, the Shedder's events carry the full
	// method as their operation too (give the Shedder the same Observer).
	// Nil costs nothing.
	Observer event.Observer
}

// Server holds the server interceptors: shedding, the deadline clamp and
// idempotency keys. It is safe for concurrent use by multiple goroutines.
type Server struct {
	cfg        ServerConfig
	shedder    *shed.Shedder
	code       codes.Code
	pushback   metadata.MD // nil: none
	maxTimeout time.Duration
	keys       *keys // nil: none
}

// NewServer returns a Server for cfg, or an error naming every invalid
// field.
func NewServer(cfg ServerConfig) (*Server, error) {
	s := &Server{cfg: cfg, shedder: cfg.Shedder, code: cfg.ShedCode, maxTimeout: cfg.MaxTimeout}
	var errs []error
	switch s.code {
	case codes.OK:
		s.code = codes.Unavailable
	case codes.Unavailable, codes.ResourceExhausted:
	default:
		errs = append(errs, invalid("ServerConfig.ShedCode is %v; want Unavailable or ResourceExhausted", cfg.ShedCode))
	}
	if cfg.MaxPriority > shed.Critical {
		errs = append(errs, invalid("ServerConfig.MaxPriority is %d; want a priority from shed.Sheddable to shed.Critical, or 0 for shed.Normal", cfg.MaxPriority))
	}
	if cfg.Keys != nil {
		k, err := newKeys(*cfg.Keys, cfg.Observer)
		if err != nil {
			errs = append(errs, err)
		}
		s.keys = k
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	switch pb := cfg.ShedPushback; {
	case pb == 0:
		s.pushback = metadata.Pairs(MDPushback, strconv.FormatInt(defaultShedPushback.Milliseconds(), 10))
	case pb < 0:
		s.pushback = metadata.Pairs(MDPushback, "-1")
	default:
		s.pushback = metadata.Pairs(MDPushback, strconv.FormatInt((pb+time.Millisecond-1).Milliseconds(), 10))
	}
	if s.maxTimeout == 0 {
		s.maxTimeout = defaultMaxTimeout
	}
	return s, nil
}

// ServerOptions returns the options that install the Server: TapHandle
// when it sheds, and its unary and stream interceptors. grpc-go runs
// chained interceptors in the order of the options: put the interceptors
// that KeyConfig.Scope or ServerConfig.Priority read from (an
// authentication interceptor) before these.
func (s *Server) ServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(s.StreamServerInterceptor()),
	}
	if s.shedder != nil {
		opts = append(opts, grpc.InTapHandle(s.TapHandle))
	}
	return opts
}

type tokenKey struct{}

// admitted is a call admitted by TapHandle: its token, and the fallback
// that frees it should no interceptor run for the call.
type admitted struct {
	tok  shed.Token
	stop func() bool
}

// TapHandle is a tap.ServerInHandle that sheds calls before grpc-go
// creates their stream, decodes their message or starts their handler:
// the cheapest place to refuse work. A shed call is answered with
// ShedCode and no trailer (gRPC sends none from a tap handle). An admitted
// call's slot is released by the interceptors when the handler returns;
// install them too (ServerOptions does). Should grpc-go end the call
// before any interceptor runs (an unknown method, a request that does not
// decode), the slot is freed when the call's context ends.
func (s *Server) TapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	if s.shedder == nil {
		return ctx, nil
	}
	tok, err := s.acquire(ctx, info.FullMethodName, info.Header)
	if err != nil {
		return ctx, status.Error(s.code, err.Error())
	}
	a := &admitted{tok: tok}
	a.stop = context.AfterFunc(ctx, tok.Ignore)
	return context.WithValue(ctx, tokenKey{}, a), nil
}

// acquire admits a call through the shedder.
func (s *Server) acquire(ctx context.Context, method string, md metadata.MD) (shed.Token, error) {
	var p shed.Priority
	if s.cfg.Priority != nil {
		p = s.cfg.Priority(ctx, method)
	} else {
		p = parsePriority(first(md, MDPriority), s.cfg.MaxPriority)
	}
	if s.cfg.Observer != nil && event.Operation(ctx) == "" {
		ctx = event.WithOperation(ctx, method)
	}
	if isRetry(md) {
		return s.shedder.AcquireRetry(ctx, p)
	}
	return s.shedder.Acquire(ctx, p)
}

// admit returns the call's slot: the one TapHandle took, or one taken
// now. A refused call gets its status error, and the pushback trailer set
// through setTrailer.
func (s *Server) admit(ctx context.Context, method string, setTrailer func(metadata.MD)) (release func(ctx context.Context), err error) {
	if s.shedder == nil {
		return nil, nil
	}
	if a, ok := ctx.Value(tokenKey{}).(*admitted); ok {
		if !a.stop() {
			return nil, nil // freed already: the call's context ended
		}
		return a.release, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	tok, err := s.acquire(ctx, method, md)
	if err != nil {
		setTrailer(s.pushback)
		return nil, status.Error(s.code, err.Error())
	}
	return func(ctx context.Context) { releaseToken(ctx, tok) }, nil
}

func (a *admitted) release(ctx context.Context) { releaseToken(ctx, a.tok) }

// releaseToken frees a slot; a call whose client went away says nothing
// about the server's latency.
func releaseToken(ctx context.Context, tok shed.Token) {
	if ctx.Err() == context.Canceled {
		tok.Ignore()
		return
	}
	tok.Release()
}

// clamp applies MaxTimeout to ctx. It reports false when the deadline has
// already passed.
func (s *Server) clamp(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	if s.maxTimeout < 0 {
		return ctx, nil, ctx.Err() == nil
	}
	now := time.Now()
	if dl, ok := ctx.Deadline(); ok {
		if !dl.After(now) || ctx.Err() != nil {
			return ctx, nil, false
		}
		if dl.Sub(now) <= s.maxTimeout {
			return ctx, nil, true
		}
	}
	ctx, cancel := context.WithDeadline(ctx, now.Add(s.maxTimeout))
	return ctx, cancel, true
}

var errExpired = status.Error(codes.DeadlineExceeded, "guardgrpc: the call's deadline passed before its handler started")

// UnaryServerInterceptor returns the unary interceptor: admission (unless
// TapHandle admitted the call), the deadline clamp, then idempotency keys.
func (s *Server) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		release, err := s.admit(ctx, info.FullMethod, func(md metadata.MD) { grpc.SetTrailer(ctx, md) })
		if err != nil {
			return nil, err
		}
		if release != nil {
			defer release(ctx)
		}
		cctx, cancel, ok := s.clamp(ctx)
		if !ok {
			return nil, errExpired
		}
		if cancel != nil {
			defer cancel()
		}
		if s.keys != nil {
			return s.keys.handle(cctx, req, info.FullMethod, handler)
		}
		return handler(cctx, req)
	}
}

// StreamServerInterceptor returns the stream interceptor: admission
// (unless TapHandle admitted the call) and the deadline clamp.
// Idempotency keys apply to unary calls only.
func (s *Server) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		release, err := s.admit(ctx, info.FullMethod, ss.SetTrailer)
		if err != nil {
			return err
		}
		if release != nil {
			defer release(ctx)
		}
		cctx, cancel, ok := s.clamp(ctx)
		if !ok {
			return errExpired
		}
		if cancel != nil {
			defer cancel()
			ss = &ctxStream{ServerStream: ss, ctx: cctx}
		}
		return handler(srv, ss)
	}
}

// ctxStream is a server stream with a clamped context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }
