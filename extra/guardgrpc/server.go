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

	"github.com/guardrail-go/guardrail/chain"
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
	// Shedder, when not nil, admits or sheds every call, in the
	// interceptors: a call waits in its queue, if it has one, on the
	// call's own goroutine, never past the call's deadline. Its events
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
	// call that was not shed carries none: one whose deadline passed
	// (DEADLINE_EXCEEDED), or whose client went away (CANCELLED), before
	// or while it waited for a slot.
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

	// Chain, when not nil, makes the server a tier of a call chain
	// (package chain), before everything else the interceptors do: a
	// call's context carries a chain.State built from its
	// x-retry-amplification metadata, for the guarded calls its handler
	// makes; a call refused before its handler ran (its deadline had
	// passed, it was shed, the key store failed) ends with the trailer
	// x-not-processed: 1, and a call that failed after its own guarded
	// calls spent their retries ends with x-already-retried: 1. An
	// x-not-processed the handler sets itself is dropped: only a refusal
	// at the door may claim that nothing ran.
	Chain *chain.Server

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

// pushbackNow returns the trailer a refusal carries: the configured
// pushback, or the longer one of the shedder's relief (shed.Shedder.Relieve)
// while one is in force, unless the pushback says not to retry at all.
func (s *Server) pushbackNow() metadata.MD {
	if s.shedder == nil || s.cfg.ShedPushback < 0 {
		return s.pushback
	}
	if d, ok := s.shedder.ReliefRetryAfter(); ok {
		return metadata.Pairs(MDPushback, strconv.FormatInt(d.Milliseconds(), 10))
	}
	return s.pushback
}

// ServerOptions returns the options that install the Server: its unary
// and stream interceptors. grpc-go runs chained interceptors in the order
// of the options: put the interceptors that KeyConfig.Scope or
// ServerConfig.Priority read from (an authentication interceptor) before
// these.
func (s *Server) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(s.StreamServerInterceptor()),
	}
}

// admit takes the call's slot, waiting in the shedder's queue if it has
// one, never past ctx's deadline. It returns nil when there is no
// shedder. A call whose deadline passed while it waited gets
// DEADLINE_EXCEEDED, one whose client went away CANCELLED; neither is a
// refusal of the server, so neither gets the pushback. A shed call gets
// ShedCode, and the pushback trailer set through setTrailer.
func (s *Server) admit(ctx context.Context, method string, setTrailer func(metadata.MD)) (release func(), err error) {
	if s.shedder == nil {
		return nil, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var p shed.Priority
	if s.cfg.Priority != nil {
		p = s.cfg.Priority(ctx, method)
	} else {
		p = parsePriority(first(md, MDPriority), s.cfg.MaxPriority)
	}
	actx := ctx
	if s.cfg.Observer != nil && event.Operation(ctx) == "" {
		actx = event.WithOperation(ctx, method)
	}
	var tok shed.Token
	if isRetry(md) {
		tok, err = s.shedder.AcquireRetry(actx, p)
	} else {
		tok, err = s.shedder.Acquire(actx, p)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ended(ctx)
		}
		setTrailer(s.pushbackNow())
		return nil, status.Error(s.code, err.Error())
	}
	if ctx.Err() != nil {
		// Granted as the call ended: the handler would not run, and its
		// zero latency says nothing of the server's.
		tok.Ignore()
		return nil, ended(ctx)
	}
	return func() { releaseToken(ctx, tok) }, nil
}

// releaseToken frees a slot; a call whose client went away says nothing
// about the server's latency.
func releaseToken(ctx context.Context, tok shed.Token) {
	if ctx.Err() == context.Canceled {
		tok.Ignore()
		return
	}
	tok.Release()
}

// clamp applies MaxTimeout to ctx. It returns the answer to a call whose
// context has already ended (its deadline passed, or its client went
// away), and then no context.
func (s *Server) clamp(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if ctx.Err() != nil {
		return nil, nil, ended(ctx)
	}
	if s.maxTimeout < 0 {
		return ctx, nil, nil
	}
	now := time.Now()
	if dl, ok := ctx.Deadline(); ok {
		if !dl.After(now) {
			return nil, nil, errExpired
		}
		if dl.Sub(now) <= s.maxTimeout {
			return ctx, nil, nil
		}
	}
	ctx, cancel := context.WithDeadline(ctx, now.Add(s.maxTimeout))
	return ctx, cancel, nil
}

var (
	errExpired  = status.Error(codes.DeadlineExceeded, "guardgrpc: the call's deadline passed before its handler started")
	errCanceled = status.Error(codes.Canceled, "guardgrpc: the call was cancelled before its handler started")
)

// ended is the answer to a call whose context ended before its handler
// started: DEADLINE_EXCEEDED when its deadline passed, CANCELLED when its
// client went away (the client has reset the stream then, so only the
// server's own interceptors and stats handlers see the code).
func ended(ctx context.Context) error {
	if ctx.Err() == context.Canceled {
		return errCanceled
	}
	return errExpired
}

// UnaryServerInterceptor returns the unary interceptor: the deadline
// check and clamp, admission, then idempotency keys. A call whose deadline
// has passed is answered DEADLINE_EXCEEDED without reaching the Shedder.
// Admission waits in the Shedder's queue, if it has one, at most until the
// clamped deadline; a call whose deadline passes there gets
// DEADLINE_EXCEEDED too, without the pushback (the Shedder counts it with
// the reason expired, apart from the calls it refused).
func (s *Server) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		outer := ctx
		var st *chain.State
		if s.cfg.Chain != nil {
			setTrailer := func(md metadata.MD) { grpc.SetTrailer(outer, md) }
			var err error
			var level int
			ctx, st, level, err = s.beginChain(ctx)
			defer chainLevel(level, setTrailer)
			if err != nil {
				setTrailer(s.pushbackNow())
				return nil, chainEnd(st, err, setTrailer)
			}
			if ts := grpc.ServerTransportStreamFromContext(ctx); ts != nil {
				ctx = grpc.NewContextWithServerTransportStream(ctx, &noMarkStream{ts})
			}
		}
		cctx, cancel, err := s.clamp(ctx)
		if err != nil {
			st.MarkNotProcessed()
			return nil, chainEnd(st, err, func(md metadata.MD) { grpc.SetTrailer(outer, md) })
		}
		if cancel != nil {
			defer cancel()
		}
		release, err := s.admit(cctx, info.FullMethod, func(md metadata.MD) { grpc.SetTrailer(outer, md) })
		if err != nil {
			st.MarkNotProcessed()
			return nil, chainEnd(st, err, func(md metadata.MD) { grpc.SetTrailer(outer, md) })
		}
		if release != nil {
			defer release()
		}
		var resp any
		if s.keys != nil {
			resp, err = s.keys.handle(cctx, req, info.FullMethod, handler)
		} else {
			resp, err = handler(cctx, req)
		}
		return resp, chainEnd(st, err, func(md metadata.MD) { grpc.SetTrailer(outer, md) })
	}
}

// beginChain returns ctx with the call's chain.State, the admission level
// in force (told to the caller in the trailer), and errCohort when that
// level refuses the call's cohort.
func (s *Server) beginChain(ctx context.Context) (context.Context, *chain.State, int, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	ctx, st := s.cfg.Chain.Begin(ctx, first(md, chain.MDAmplification), first(md, chain.MDCohort))
	level, refused := s.cfg.Chain.Refuses(ctx, st)
	if refused {
		st.MarkNotProcessed()
		return ctx, st, level, errCohort
	}
	return ctx, st, level, nil
}

// errCohort answers a call refused at the door for its cohort: UNAVAILABLE,
// which a client retries after the pushback the trailer carries.
var errCohort = status.Error(codes.Unavailable, "guardgrpc: shed: the call's cohort is below the admission level")

// chainEnd adds the chain's marker to a call that ends with err, through
// setTrailer, and returns err. Only failures that a client might retry
// are marked.
func chainEnd(st *chain.State, err error, setTrailer func(metadata.MD)) error {
	if st == nil || err == nil {
		return err
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded, codes.Internal, codes.Unknown, codes.Aborted:
	default:
		return err
	}
	switch {
	case st.NotProcessed():
		setTrailer(notProcessedMD)
	case st.Retried():
		setTrailer(retriedMD)
	}
	return err
}

// chainLevel adds the admission level, when above 0, to the trailer of a
// call, through setTrailer.
func chainLevel(level int, setTrailer func(metadata.MD)) {
	if level > 0 {
		setTrailer(metadata.Pairs(chain.MDAdmission, strconv.Itoa(level)))
	}
}

var (
	notProcessedMD = metadata.Pairs(chain.MDNotProcessed, "1")
	retriedMD      = metadata.Pairs(chain.MDRetried, "1")
)

// noMarkStream is the transport stream a handler sees: it drops the
// x-not-processed marker from what the handler sets, so that only a
// refusal at the door sends it.
type noMarkStream struct{ grpc.ServerTransportStream }

func (s *noMarkStream) SetHeader(md metadata.MD) error {
	return s.ServerTransportStream.SetHeader(dropMark(md))
}
func (s *noMarkStream) SendHeader(md metadata.MD) error {
	return s.ServerTransportStream.SendHeader(dropMark(md))
}
func (s *noMarkStream) SetTrailer(md metadata.MD) error {
	return s.ServerTransportStream.SetTrailer(dropMark(md))
}

// dropMark returns md without chain.MDNotProcessed, copied only when it
// had it.
func dropMark(md metadata.MD) metadata.MD {
	if _, ok := md[chain.MDNotProcessed]; !ok {
		return md
	}
	md = md.Copy()
	delete(md, chain.MDNotProcessed)
	return md
}

// StreamServerInterceptor returns the stream interceptor: the deadline
// check and clamp, then admission, as UnaryServerInterceptor. Idempotency
// keys apply to unary calls only.
func (s *Server) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		outer := ss
		ctx := ss.Context()
		var st *chain.State
		if s.cfg.Chain != nil {
			var err error
			var level int
			ctx, st, level, err = s.beginChain(ctx)
			defer chainLevel(level, outer.SetTrailer)
			if err != nil {
				outer.SetTrailer(s.pushbackNow())
				return chainEnd(st, err, outer.SetTrailer)
			}
			ss = &ctxStream{ServerStream: ss, ctx: ctx, noMark: true}
		}
		cctx, cancel, err := s.clamp(ctx)
		if err != nil {
			st.MarkNotProcessed()
			return chainEnd(st, err, outer.SetTrailer)
		}
		if cancel != nil {
			defer cancel()
			ss = &ctxStream{ServerStream: ss, ctx: cctx, noMark: st != nil}
		}
		release, err := s.admit(cctx, info.FullMethod, outer.SetTrailer)
		if err != nil {
			st.MarkNotProcessed()
			return chainEnd(st, err, outer.SetTrailer)
		}
		if release != nil {
			defer release()
		}
		return chainEnd(st, handler(srv, ss), outer.SetTrailer)
	}
}

// ctxStream is a server stream with a context of the interceptor's (the
// clamped deadline, the chain's State) and, with noMark, without the
// handler's x-not-processed.
type ctxStream struct {
	grpc.ServerStream
	ctx    context.Context
	noMark bool
}

func (s *ctxStream) Context() context.Context { return s.ctx }

func (s *ctxStream) SetHeader(md metadata.MD) error {
	if s.noMark {
		md = dropMark(md)
	}
	return s.ServerStream.SetHeader(md)
}

func (s *ctxStream) SendHeader(md metadata.MD) error {
	if s.noMark {
		md = dropMark(md)
	}
	return s.ServerStream.SendHeader(md)
}

func (s *ctxStream) SetTrailer(md metadata.MD) {
	if s.noMark {
		md = dropMark(md)
	}
	s.ServerStream.SetTrailer(md)
}
