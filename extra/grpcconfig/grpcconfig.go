// Package grpcconfig installs the gRPC dependencies of a guardrail policy
// file on gRPC connections: a guardgrpc client whose settings follow the
// file's reloads.
//
// The config package reads the file and keeps, for each kind: grpc
// dependency, its settings in core types only (config.GRPCSettings), so
// that a program using config without gRPC never has gRPC in its module
// graph. This package, a module of its own beside guardgrpc, turns them
// into a guardgrpc.ClientConfig, which is all a hand-written client would
// hold:
//
//	reg, err := config.Load("policy.yaml", config.Options{Observer: obs})
//	inventory, err := grpcconfig.NewClient(reg, "inventory", grpcconfig.Options{})
//	conn, err := grpc.NewClient(target, append(inventory.DialOptions(), creds)...)
package grpcconfig

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/guardrail-go/guardrail/extra/config"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/throttle"
)

// Options are the parts of a guardgrpc.ClientConfig that are code rather
// than configuration, and so cannot come from a file. The zero value is
// valid: guardgrpc's defaults. A plain value; what it points to must be
// safe for concurrent use.
type Options struct {
	// Classify is guardgrpc.ClientConfig.Classify. Nil means
	// guardgrpc.DefaultClassify.
	Classify guardgrpc.Classifier
	// Attempt is guardgrpc.ClientConfig.Attempt, the seam for a policy of
	// one's own around each attempt; when the file hedges the dependency,
	// each copy sent is an attempt run through it. Nil means the invoker
	// itself.
	Attempt guardgrpc.AttemptFunc
	// Rand is guardgrpc.ClientConfig.Rand. Nil means math/rand/v2.
	Rand func() float64
}

// ClientConfig returns the guardgrpc.ClientConfig that s and opts
// describe: the one a hand-written client would be built with from the
// same numbers, sharing s's Budget, Breakers, Bulkheads and Throttler.
// Settings not from a Registry (built by hand) may have a throttle
// configuration and no Throttler: each call then builds a Throttler of
// its own; or a bulkhead configuration and no Bulkheads: guardgrpc then
// builds the group.
func ClientConfig(s *config.GRPCSettings, opts Options) guardgrpc.ClientConfig {
	cfg := guardgrpc.ClientConfig{
		Name:                s.Name,
		Retry:               s.Retry,
		Observer:            s.Observer,
		IdempotentMethods:   slices.Clone(s.IdempotentMethods),
		Breakers:            s.Breakers,
		Bulkheads:           s.Bulkheads,
		MaxBufferedMessages: s.MaxBufferedMessages,
		Classify:            opts.Classify,
		Attempt:             opts.Attempt,
		Rand:                opts.Rand,
		Throttler:           s.Throttler,
	}
	if s.Hedge != nil {
		h := *s.Hedge
		cfg.Hedge = &h
	}
	if s.Throttler == nil && s.Throttle != nil {
		// The config package refuses a configuration NewThrottler
		// refuses, so the error is not met; were it, no throttle.
		cfg.Throttler, _ = throttle.New(*s.Throttle)
	}
	if s.Bulkheads == nil && s.Bulkhead != nil {
		// Settings not from a Registry may have a configuration and no
		// group.
		bc := *s.Bulkhead
		cfg.Bulkhead = &bc
	}
	if s.ByMethod {
		cfg.Key = guardgrpc.ByMethod
	}
	return cfg
}

// built is the guardgrpc.Client of one config.GRPCSettings value.
type built struct {
	src    *config.GRPCSettings
	client *guardgrpc.Client
	cfg    guardgrpc.ClientConfig
	unary  grpc.UnaryClientInterceptor
	stream grpc.StreamClientInterceptor
}

// Client is a gRPC dependency of a policy file, installed on connections
// by DialOptions. Each call runs under the settings in force when it
// starts: a reload that changes them builds a new guardgrpc.Client for the
// calls that follow, with the breakers, retry budget, bulkhead
// compartments and throttler whose own settings did not change, state
// included, while the calls already started finish under the old one. (The
// latencies an adaptive hedge delay is taken from belong to the
// guardgrpc.Client, and start afresh with the new one.)
//
// A Client is safe for concurrent use.
type Client struct {
	src  *config.GRPCHandle
	opts Options
	mu   sync.Mutex // serialises rebuilds
	cur  atomic.Pointer[built]
}

// NewClient returns the Client of the gRPC dependency name of reg, or an
// error that Is config.ErrUnknown when the file has no such gRPC
// dependency. Every Client of one dependency shares its breakers, budget,
// bulkhead compartments and throttler, which belong to reg.
func NewClient(reg *config.Registry, name string, opts Options) (*Client, error) {
	h, err := reg.GRPC(name)
	if err != nil {
		return nil, err
	}
	c := &Client{src: h, opts: opts}
	b, err := c.build(h.Current())
	if err != nil {
		return nil, err
	}
	c.cur.Store(b)
	return c, nil
}

func (c *Client) build(s *config.GRPCSettings) (*built, error) {
	cfg := ClientConfig(s, c.opts)
	own := cfg
	// DialOptions turns grpc-go's retries off on the connection.
	own.ConnRetriesDisabled = true
	cl, err := guardgrpc.NewClient(own)
	if err != nil {
		return nil, err
	}
	return &built{src: s, client: cl, cfg: cfg, unary: cl.UnaryClientInterceptor(), stream: cl.StreamClientInterceptor()}, nil
}

// current returns the client of the settings in force.
func (c *Client) current() *built {
	s := c.src.Current()
	if b := c.cur.Load(); b.src == s {
		return b
	}
	return c.rebuild(s)
}

func (c *Client) rebuild(s *config.GRPCSettings) *built {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.cur.Load()
	if old.src == s {
		return old
	}
	b, err := c.build(s)
	if err != nil {
		// The config package refuses every value guardgrpc.NewClient
		// refuses, so this is not reached; should it be, the calls keep
		// the settings that built.
		b = &built{src: s, client: old.client, cfg: old.cfg, unary: old.unary, stream: old.stream}
	}
	c.cur.Store(b)
	return b
}

// DialOptions returns the options that install the Client on a
// connection: its interceptors, and grpc.WithDisableRetry so that the
// Client alone retries, as guardgrpc.Client.DialOptions does.
func (c *Client) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDisableRetry(),
		grpc.WithChainUnaryInterceptor(c.unary),
		grpc.WithChainStreamInterceptor(c.stream),
	}
}

// unary runs a unary call under the settings in force, bounded by the
// dependency's deadline when the file sets one.
func (c *Client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	b := c.current()
	if d := b.src.Deadline; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	return b.unary(ctx, method, req, reply, cc, invoker, opts...)
}

// stream opens a stream under the settings in force. The dependency's
// deadline does not bound it, as attempt_timeout does not: a stream may
// rightly outlive both, and the caller's context bounds it.
func (c *Client) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.current().stream(ctx, desc, cc, method, streamer, opts...)
}

// Current returns the guardgrpc.Client of the settings in force, for its
// Breakers, RetryBudget and Bulkheads.
func (c *Client) Current() *guardgrpc.Client { return c.current().client }

// Config returns the guardgrpc.ClientConfig of the settings in force (as
// ClientConfig returns it), and the deadline bounding each unary call,
// zero when none.
func (c *Client) Config() (guardgrpc.ClientConfig, time.Duration) {
	b := c.current()
	cfg := b.cfg
	cfg.IdempotentMethods = slices.Clone(cfg.IdempotentMethods)
	return cfg, b.src.Deadline
}
