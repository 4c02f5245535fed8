// Package grpcfault injects the faults of a fault.Injector into gRPC calls,
// as server and client interceptors.
//
// The rules, their files, their counters and the admin endpoint are those
// of package fault: one Injector can serve HTTP and gRPC at once. A gRPC
// call is matched as a POST whose path is the full method
// ("/pkg.Service/Method"), whose host is the :authority (client side, the
// ClientConn's target without its scheme) and whose headers are its
// metadata; Match.Headers names are compared in lower case.
//
// The faults become what a gRPC client sees of the real failures:
//
//   - Latency waits before the handler runs (server side) or before the
//     call is sent (client side); a context that ends first fails the call
//     with DEADLINE_EXCEEDED or CANCELLED.
//   - Status answers with Status.GRPCCode when the rule names one, else
//     with Status.Code mapped as the gRPC spec maps HTTP statuses (400
//     INTERNAL, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404
//     UNIMPLEMENTED, 429, 502, 503 and 504 UNAVAILABLE, any other
//     UNKNOWN), without running the handler. A RetryAfter is sent as the
//     grpc-retry-pushback-ms trailer, in milliseconds rounded up; client
//     side it is written to the call's grpc.Trailer option, where an
//     interceptor such as guardgrpc's reads a server's trailer.
//   - Reset and Refuse answer UNAVAILABLE, with a message that says which,
//     without running the handler or sending the call.
//   - Hang holds the call until its context ends (or the Injector is
//     closed, which answers UNAVAILABLE).
//   - LoseResponse runs the handler to completion (server side; a stream's
//     messages are dropped) or sends the call and receives its answer
//     (client side), then answers UNAVAILABLE: the work is done, the
//     caller cannot know it.
//   - SlowBody, StallBody and Truncate act on an HTTP body: gRPC calls
//     pass through.
//
// A header fault, when Config.HeaderFaults is set, is read from the
// x-fault metadata key (the lower-case Config.Header). Unlike the HTTP
// Transport, the client interceptors do not remove it from the outgoing
// metadata, so a server with header faults enabled applies it again.
// A malformed one answers INVALID_ARGUMENT.
package grpcfault

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/fault"
)

// mdPushback is the trailer key of a server's pushback, in milliseconds.
const mdPushback = "grpc-retry-pushback-ms"

// The messages of the faults that have no status of their own.
const (
	msgReset  = "fault: connection reset"
	msgRefuse = "fault: connection refused"
	msgLost   = "fault: response lost after the call was processed"
)

// UnaryServerInterceptor returns a server interceptor that applies in's
// faults to the unary calls it receives (see the package comment). It is
// safe for concurrent use.
func UnaryServerInterceptor(in *fault.Injector) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		f, err := in.Apply(ctx, fault.Call{Method: "POST", Path: info.FullMethod, Metadata: func(key string) []string {
			return metadata.ValueFromIncomingContext(ctx, key) // the :authority too
		}})
		if err != nil {
			return nil, errorOf(err)
		}
		switch f := f.(type) {
		case fault.Status:
			if md := pushback(f); md != nil {
				_ = grpc.SetTrailer(ctx, md)
			}
			return nil, statusOf(f).Err()
		case fault.Reset:
			return nil, status.Error(codes.Unavailable, msgReset)
		case fault.Refuse:
			return nil, status.Error(codes.Unavailable, msgRefuse)
		case fault.LoseResponse:
			_, _ = handler(ctx, req)
			return nil, status.Error(codes.Unavailable, msgLost)
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns a server interceptor that applies in's
// faults to the streams it receives, once when the stream starts (see the
// package comment). It is safe for concurrent use.
func StreamServerInterceptor(in *fault.Injector) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		f, err := in.Apply(ctx, fault.Call{Method: "POST", Path: info.FullMethod, Metadata: func(key string) []string {
			return metadata.ValueFromIncomingContext(ctx, key) // the :authority too
		}})
		if err != nil {
			return errorOf(err)
		}
		switch f := f.(type) {
		case fault.Status:
			if md := pushback(f); md != nil {
				ss.SetTrailer(md)
			}
			return statusOf(f).Err()
		case fault.Reset:
			return status.Error(codes.Unavailable, msgReset)
		case fault.Refuse:
			return status.Error(codes.Unavailable, msgRefuse)
		case fault.LoseResponse:
			_ = handler(srv, lostServerStream{ss})
			return status.Error(codes.Unavailable, msgLost)
		}
		return handler(srv, ss)
	}
}

// lostServerStream drops the messages its handler sends.
type lostServerStream struct{ grpc.ServerStream }

func (lostServerStream) SendMsg(any) error { return nil }

// UnaryClientInterceptor returns a client interceptor that applies in's
// faults to the unary calls it sends (see the package comment). It is safe
// for concurrent use.
func UnaryClientInterceptor(in *fault.Injector) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		f, err := in.Apply(ctx, fault.Call{Method: "POST", Host: host(cc), Path: method, Metadata: func(key string) []string {
			return metadata.ValueFromOutgoingContext(ctx, key)
		}})
		if err != nil {
			return errorOf(err)
		}
		switch f := f.(type) {
		case fault.Status:
			return clientStatus(f, cc, opts)
		case fault.Reset:
			// A reset comes after the call left: it may have been processed.
			setPeer(cc, opts)
			return status.Error(codes.Unavailable, msgReset)
		case fault.Refuse:
			return status.Error(codes.Unavailable, msgRefuse)
		case fault.LoseResponse:
			if err := invoker(ctx, method, req, reply, cc, opts...); status.Code(err) == codes.Canceled ||
				status.Code(err) == codes.DeadlineExceeded {
				return err // the caller gave up first: nothing was lost
			}
			return status.Error(codes.Unavailable, msgLost)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor returns a client interceptor that applies in's
// faults to the streams it opens, once when the stream starts (see the
// package comment). With LoseResponse the stream is opened and its
// messages sent, and the first message or end of stream received is lost:
// RecvMsg answers UNAVAILABLE and the stream is cancelled. It is safe for
// concurrent use.
func StreamClientInterceptor(in *fault.Injector) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		f, err := in.Apply(ctx, fault.Call{Method: "POST", Host: host(cc), Path: method, Metadata: func(key string) []string {
			return metadata.ValueFromOutgoingContext(ctx, key)
		}})
		if err != nil {
			return nil, errorOf(err)
		}
		switch f := f.(type) {
		case fault.Status:
			return nil, clientStatus(f, cc, opts)
		case fault.Reset:
			setPeer(cc, opts)
			return nil, status.Error(codes.Unavailable, msgReset)
		case fault.Refuse:
			return nil, status.Error(codes.Unavailable, msgRefuse)
		case fault.LoseResponse:
			ctx, cancel := context.WithCancel(ctx)
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				cancel()
				return nil, err
			}
			return &lostClientStream{ClientStream: cs, cancel: cancel}, nil
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}

// lostClientStream loses the first answer it receives.
type lostClientStream struct {
	grpc.ClientStream
	cancel context.CancelFunc
}

func (s *lostClientStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil && err != io.EOF {
		s.cancel()
		return err
	}
	s.cancel()
	// Receive until the stream has ended, so that its trailer and peer are
	// written before the caller reads them.
	for s.ClientStream.RecvMsg(m) == nil {
	}
	return status.Error(codes.Unavailable, msgLost)
}

// host is what the calls on cc are matched on as a host.
func host(cc *grpc.ClientConn) string {
	if cc == nil {
		return ""
	}
	return authority(cc.Target())
}

// authority returns a target without its scheme: "dns:///pricing:443" is
// "pricing:443".
func authority(target string) string {
	if _, rest, ok := strings.Cut(target, "://"); ok {
		target = rest
		if i := strings.IndexByte(target, '/'); i >= 0 {
			target = target[i+1:] // drop the resolver's authority
		}
	}
	return target
}

// clientStatus returns the status of f and puts its pushback, if any, in
// the call's grpc.Trailer options, as if the server had sent it. The error
// is also marked with guardrail.RetryAfterError, for a guardrail.Do that
// wraps the call without guardgrpc.
func clientStatus(f fault.Status, cc *grpc.ClientConn, opts []grpc.CallOption) error {
	err := statusOf(f).Err()
	setPeer(cc, opts)
	md := pushback(f)
	if md == nil {
		return err
	}
	for _, o := range opts {
		if t, ok := o.(grpc.TrailerCallOption); ok && t.TrailerAddr != nil {
			*t.TrailerAddr = md
		}
	}
	return guardrail.RetryAfterError(err, f.RetryAfter)
}

// setPeer fills the call's grpc.Peer options with cc's target, for the
// faults that stand for an answer from a server: a caller that tells a
// call that never left by its missing peer (guardgrpc does) sees one that
// did.
func setPeer(cc *grpc.ClientConn, opts []grpc.CallOption) {
	for _, o := range opts {
		if p, ok := o.(grpc.PeerCallOption); ok && p.PeerAddr != nil {
			target := ""
			if cc != nil {
				target = authority(cc.Target())
			}
			*p.PeerAddr = peer.Peer{Addr: faultAddr(target)}
		}
	}
}

// faultAddr is the address of the peer an injected fault stands for.
type faultAddr string

func (faultAddr) Network() string  { return "fault" }
func (a faultAddr) String() string { return string(a) }

var _ net.Addr = faultAddr("")

// statusOf returns the gRPC status an injected Status answers.
func statusOf(f fault.Status) *status.Status {
	code := f.Code
	if code == 0 {
		code = 503
	}
	msg := "fault: injected status " + strconv.Itoa(code)
	if f.GRPCCode != "" {
		var c codes.Code
		if c.UnmarshalJSON([]byte(`"`+f.GRPCCode+`"`)) == nil {
			return status.New(c, "fault: injected status "+f.GRPCCode)
		}
	}
	return status.New(codeOfHTTP(code), msg)
}

// codeOfHTTP maps an HTTP status to a gRPC code as the gRPC spec does
// (doc/http-grpc-status-mapping.md).
func codeOfHTTP(code int) codes.Code {
	switch code {
	case 400:
		return codes.Internal
	case 401:
		return codes.Unauthenticated
	case 403:
		return codes.PermissionDenied
	case 404:
		return codes.Unimplemented
	case 429, 502, 503, 504:
		return codes.Unavailable
	}
	return codes.Unknown
}

// pushback returns the trailer that carries f's RetryAfter, or nil.
func pushback(f fault.Status) metadata.MD {
	if f.RetryAfter <= 0 {
		return nil
	}
	ms := (f.RetryAfter + time.Millisecond - 1) / time.Millisecond
	return metadata.Pairs(mdPushback, strconv.FormatInt(int64(ms), 10))
}

// errorOf returns the status of an error of fault.Injector.Apply.
func errorOf(err error) error {
	switch {
	case errors.Is(err, fault.ErrClosed):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, fault.ErrInvalidConfig):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.FromContextError(err).Err()
}
