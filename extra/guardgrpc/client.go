package guardgrpc

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/throttle"
)

// DefaultMaxBufferedMessages is how many request messages of a stream the
// client keeps, until the first response message, to send them again on a
// retry.
const DefaultMaxBufferedMessages = 64

// ClientConfig configures a Client. The zero value is valid and safe: 3
// attempts with full jitter backoff, a retry budget of 10 %, pushback
// honoured up to 30 s, a circuit breaker per target, no bulkhead, and no
// method idempotent: a call is retried only when it never reached the
// server, unless its method is listed in IdempotentMethods or it carries
// an idempotency-key.
//
// A ClientConfig is a plain value that NewClient reads once, so changing
// it afterwards has no effect, and it is safe to share; the values it
// points to (Budget, Observer, Breakers, Classify, Key, Attempt,
// Throttler) must be safe for concurrent use; Hedge is read once, by
// NewClient.
type ClientConfig struct {
	// Name labels the dependency in events and errors. Empty means each
	// call's key (see Key): by default the connection's target. It
	// becomes a metric label: keep it to a small fixed set.
	Name string

	// Retry is how calls retry, as in guardrail.Policy. AttemptTimeout
	// bounds each attempt of a unary call, and grpc-go sends it to the
	// server as grpc-timeout; a stream is bounded by the caller's context
	// alone: it may rightly live long. The server's pushback is the
	// Retry-After that MaxRetryAfter caps (a negative pushback forbids the
	// retry). A nil Budget means a budget of this Client alone: share one
	// with a guardhttp.Transport to budget both protocols together.
	guardrail.Retry

	// Observer receives the events of every call, with the full method
	// name as the operation (unless the caller set one with
	// event.WithOperation), and the transitions of the breakers the
	// Client creates. Nil costs nothing.
	Observer event.Observer

	// IdempotentMethods lists the methods that are safe to repeat, by
	// full method name ("/pkg.Service/Get"); a name ending in "/"
	// ("/pkg.Service/") covers every method of that service. Any other
	// method is not idempotent unless the call carries an idempotency-key
	// in its outgoing metadata: it is retried only when it never reached
	// the server, and a timeout of it is an unknown outcome.
	IdempotentMethods []string

	// Classify decides what a failed attempt means. Nil means
	// DefaultClassify.
	Classify Classifier

	// Key returns a call's failure domain: its breaker and bulkhead key,
	// and its dependency label when Name is empty. Nil means the
	// connection's target (cc.Target()); use ByMethod for a breaker per
	// method. Keep the set of keys small.
	Key func(cc *grpc.ClientConn, method string) string

	// Breakers holds one circuit breaker per key. Nil means a group of
	// this Client's own with breaker's defaults (at most
	// breaker.DefaultMaxKeys keys), its transitions sent to Observer. A
	// group whose Config.Mode is breaker.Disabled turns breakers off.
	Breakers *breaker.Group

	// Bulkhead, when not nil, gives each key a compartment so configured:
	// at most MaxConcurrent unary attempts or stream openings in flight,
	// the wait bounded by MaxWait and the time left minus MinAttemptTime.
	// A refused call fails with RESOURCE_EXHAUSTED (an *Error that Is
	// guardrail.ErrBulkheadFull). A stream holds its slot while it opens,
	// not for its whole life. Nil means no bound.
	Bulkhead *bulkhead.Config

	// Bulkheads, when not nil, holds the compartment of each key in place
	// of the group Bulkhead would configure: share one between Clients to
	// bound their calls together, or hand it to the Client that replaces
	// this one (as a policy file reload does) so that the calls in flight
	// stay counted. Set Bulkhead or Bulkheads, not both. Nil means the
	// Client's own group when Bulkhead is set, else no bound.
	Bulkheads *bulkhead.Group

	// MaxBufferedMessages bounds the request messages of a stream kept
	// until its first response message to send them again on a retry; a
	// stream that sends more is not retried once it has opened. Zero means
	// DefaultMaxBufferedMessages; negative means none are kept (a stream
	// is retried only while it opens).
	MaxBufferedMessages int

	// ConnRetriesDisabled tells the interceptors that the connections they
	// are installed on were built with grpc.WithDisableRetry, as
	// DialOptions does. Without it, an interceptor installed on its own
	// looks up the method's service config on every call and, when it has
	// a retryPolicy, leaves retrying to grpc-go (one attempt of ours), so
	// that the two never multiply.
	ConnRetriesDisabled bool

	// Attempt, when not nil, runs each unary attempt in place of the
	// invoker: it must send the call (once, or more than once
	// concurrently) and return one result. The engine sees one attempt,
	// one breaker outcome and one retry decision, whatever it does. It is
	// the seam for a policy of one's own (Hedge is guardgrpc's hedging);
	// with Hedge set, each copy the engine hedges is an attempt of its
	// own, run through Attempt. Nil means the invoker itself.
	Attempt AttemptFunc

	// Hedge, when not nil, hedges the unary calls of the methods listed
	// in IdempotentMethods: when an attempt has not answered after the
	// hedge delay another copy is sent, the first good answer is returned
	// and the other copies are cancelled. A call that carries an
	// idempotency-key is not hedged, though it is retried: two copies in
	// flight with one key meet the server's refusal of a key in flight
	// (ABORTED), not a replay. Hedges spend retry budget tokens, and none
	// is sent while the budget holds less than half its maximum, while
	// the key's breaker is not closed, or for HedgeConfig.OverloadPause
	// after the server answered RESOURCE_EXHAUSTED or sent a
	// grpc-retry-pushback-ms trailer (see guardrail.HedgeConfig). A hedge
	// is an attempt: it carries x-retry-attempt, so a server sheds it as
	// it sheds retries.
	//
	// Streams are never hedged: their messages go out as the caller
	// produces them and answers come back as it reads them, so there is
	// no one answer to race, and a second copy would have to send every
	// message again and would make a stream that rightly lives long look
	// slow. A method grpc-go retries itself (see ConnRetriesDisabled) is
	// not hedged either: hedges would multiply with its retries.
	//
	// Each copy decodes into a reply of its own when another copy may be
	// running; the winner's is then copied into the caller's (proto.Merge
	// for a proto.Message, an assignment for another pointer type), as are
	// its header, trailer and peer for the caller's grpc.Header,
	// grpc.Trailer and grpc.Peer options. A call whose reply is not a
	// pointer is not hedged. The interceptor returns once every copy that
	// may write the caller's reply has returned; cancelled losers that
	// write only their own finish on their goroutines. Nil means no
	// hedging.
	Hedge *guardrail.HedgeConfig

	// Throttler, when not nil, rejects attempts of unary calls locally,
	// without sending them, when the server has lately refused too many:
	// see throttle.Throttler. An attempt answered RESOURCE_EXHAUSTED, one
	// with a grpc-retry-pushback-ms trailer, DEADLINE_EXCEEDED and an
	// attempt that timed out are not accepts; any other answer is one
	// (NOT_FOUND, INVALID_ARGUMENT, INTERNAL: the server did the work),
	// and so is UNAVAILABLE without a pushback, which grpc-go also answers
	// for a connection that failed: that is the breaker's to judge. A
	// rejected call fails with RESOURCE_EXHAUSTED, an *Error that Is
	// guardrail.ErrThrottled.
	//
	// Streams are not throttled: grpc-go opens a stream before the server
	// has answered anything, so an opening says nothing of whether the
	// server took the call, and counting openings as accepts would hide a
	// server that refuses every stream.
	//
	// It is one throttle for every key of the Client: share it only
	// between Clients that call the same servers. Nil means no throttling.
	Throttler *throttle.Throttler

	// Rand returns uniform draws in [0, 1) for backoff jitter and the
	// throttle's rejections. Nil means math/rand/v2.
	Rand func() float64
}

// AttemptFunc runs one attempt of a unary call, described by a; see
// ClientConfig.Attempt. ctx is the attempt's context. It must be safe for
// concurrent use, must not keep a after it returns, and must not leave a
// copy of the call running past its return: a copy it started is done or
// cancelled by then.
type AttemptFunc func(ctx context.Context, a *Attempt) error

// Attempt is one attempt of a unary call, for an AttemptFunc. It is owned
// by the Client and valid only until the AttemptFunc returns; read it, do
// not modify it.
type Attempt struct {
	// Method, Req, Reply, Conn and Invoker are the interceptor's.
	Method     string
	Req, Reply any
	Conn       *grpc.ClientConn
	Invoker    grpc.UnaryInvoker
	// Idempotent reports whether the call may be sent twice: only then
	// may an AttemptFunc send a second copy.
	Idempotent bool
	// Opts are the options of the copy whose result is returned: the
	// caller's, then the Client's own, which read its trailer and peer
	// for classification.
	Opts []grpc.CallOption
	// CallerOpts are the caller's options alone, for any other copy, so
	// that two copies never write the same trailer.
	CallerOpts []grpc.CallOption
}

// Invoke sends one copy of the call with opts.
func (a *Attempt) Invoke(ctx context.Context, opts ...grpc.CallOption) error {
	return a.Invoker(ctx, a.Method, a.Req, a.Reply, a.Conn, opts...)
}

// ByMethod is a ClientConfig.Key that gives every method of every target a
// breaker of its own: the target and the full method name.
func ByMethod(cc *grpc.ClientConn, method string) string { return cc.Target() + method }

// Client holds the client interceptors and the state they share: the
// retry budget, the breakers and the bulkheads. It is safe for concurrent
// use by multiple goroutines.
type Client struct {
	cfg        ClientConfig
	classify   Classifier
	key        func(*grpc.ClientConn, string) string
	idem       map[string]bool
	maxBuf     int
	maxAttempt int
	breakers   *breaker.Group
	bulkheads  *bulkhead.Group  // nil: none
	policy     guardrail.Policy // every call's; a Call refines it per method and stream
	hedges     bool             // ClientConfig.Hedge is set
	resumeObs  event.Observer   // the Observer without CallStart and CallEnd; nil without one
	pool       sync.Pool        // *unaryCall
	levels     chain.Levels
}

// AdmissionLevel returns the highest admission level the servers reported
// in their trailers (chain.MDAdmission) within the last chain.LevelTTL,
// 0 if none: what a chain.Server in front of the handler that calls
// through this Client refuses at its door (chain.Config.Admission). Unary
// calls report it.
func (c *Client) AdmissionLevel() int { return c.levels.Level(time.Now()) }

// NewClient returns a Client for cfg, or an error naming every invalid
// field.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, classify: cfg.Classify, key: cfg.Key, maxBuf: cfg.MaxBufferedMessages, maxAttempt: cfg.MaxAttempts}
	if c.classify == nil {
		c.classify = DefaultClassify
	}
	if c.key == nil {
		c.key = func(cc *grpc.ClientConn, _ string) string { return cc.Target() }
	}
	if c.maxBuf == 0 {
		c.maxBuf = DefaultMaxBufferedMessages
	}
	if c.maxAttempt == 0 {
		c.maxAttempt = guardrail.DefaultMaxAttempts
	}
	c.idem = make(map[string]bool, len(cfg.IdempotentMethods))
	for _, m := range cfg.IdempotentMethods {
		c.idem[m] = true
	}
	c.policy = guardrail.Policy{
		Name:      cfg.Name,
		Retry:     cfg.Retry,
		Classify:  classifyMarked,
		Observer:  cfg.Observer,
		Hedge:     cfg.Hedge,
		Throttler: cfg.Throttler,
		Rand:      cfg.Rand,
	}
	// Every call brings the breaker of its key; the Policy's own would be
	// one breaker for every target.
	c.policy.Breaker, _ = breaker.New(breaker.Config{Mode: breaker.Disabled}) // a valid Config
	c.hedges = cfg.Hedge != nil
	// A resumed stream's engine call is not a new call: its start and end
	// are not reported again.
	if cfg.Observer != nil {
		c.resumeObs = attemptsOnly{cfg.Observer}
	}
	c.breakers = cfg.Breakers
	if c.breakers == nil {
		var gc breaker.GroupConfig
		if obs, name := cfg.Observer, cfg.Name; obs != nil {
			gc.Config.Observer = event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
				if name != "" {
					e.Dependency = name // the client's name, not the key's
				}
				return obs.Observe(ctx, e)
			})
		}
		c.breakers, _ = breaker.NewGroup(gc) // a valid GroupConfig
	}
	c.bulkheads = cfg.Bulkheads
	if cfg.Bulkhead != nil {
		c.bulkheads, _ = bulkhead.NewGroup(bulkhead.GroupConfig{Config: *cfg.Bulkhead}) // validate checked cfg.Bulkhead
	}
	c.pool.New = func() any { return new(unaryCall) }
	return c, nil
}

// validate reports every invalid field of cfg.
func (cfg *ClientConfig) validate() error {
	var errs []error
	if err := cfg.Retry.Validate("guardgrpc: ClientConfig"); err != nil {
		errs = append(errs, &configError{msg: err.Error(), err: err})
	}
	for _, m := range cfg.IdempotentMethods {
		if !strings.HasPrefix(m, "/") {
			errs = append(errs, invalid("ClientConfig.IdempotentMethods holds %q; want a full method name such as \"/pkg.Service/Method\"", m))
		}
	}
	if cfg.Hedge != nil {
		if err := cfg.Hedge.Validate(); err != nil {
			errs = append(errs, &configError{msg: "guardgrpc: ClientConfig.Hedge: " + err.Error(), err: err})
		}
	}
	if cfg.Bulkhead != nil && cfg.Bulkheads != nil {
		errs = append(errs, invalid("ClientConfig.Bulkhead and ClientConfig.Bulkheads are both set; want one: the configuration of the Client's own compartments, or a group of them"))
	}
	if cfg.Bulkhead != nil {
		if _, err := bulkhead.New(*cfg.Bulkhead); err != nil {
			errs = append(errs, &configError{msg: "guardgrpc: ClientConfig.Bulkhead: " + err.Error(), err: err})
		}
	}
	return errors.Join(errs...)
}

// attemptsOnly drops CallStart and CallEnd.
type attemptsOnly struct{ event.Observer }

func (o attemptsOnly) Observe(ctx context.Context, e event.Event) context.Context {
	if e.Kind == event.CallStart || e.Kind == event.CallEnd {
		return ctx
	}
	return o.Observer.Observe(ctx, e)
}

// DialOptions returns the options that install the Client on a connection:
// its unary and stream interceptors, and grpc.WithDisableRetry, so that
// the Client alone retries (grpc-go's service-config retries would
// multiply with its own). grpc-go still retries, once, an attempt whose
// stream the server never processed (its transparent retry): that attempt
// never ran, so it costs the server nothing.
func (c *Client) DialOptions() []grpc.DialOption {
	d := &disabled{c: c}
	return []grpc.DialOption{
		grpc.WithDisableRetry(),
		grpc.WithChainUnaryInterceptor(d.unary),
		grpc.WithChainStreamInterceptor(d.stream),
	}
}

// disabled is the Client as installed by DialOptions, on connections
// whose own retries are off.
type disabled struct{ c *Client }

func (d *disabled) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return d.c.invoke(ctx, method, req, reply, cc, invoker, true, opts)
}

func (d *disabled) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return d.c.newStream(ctx, desc, cc, method, streamer, true, opts)
}

// UnaryClientInterceptor returns the unary interceptor, for connections
// built without DialOptions (see ClientConfig.ConnRetriesDisabled).
func (c *Client) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return c.invoke(ctx, method, req, reply, cc, invoker, c.cfg.ConnRetriesDisabled, opts)
	}
}

// StreamClientInterceptor returns the stream interceptor, for connections
// built without DialOptions (see ClientConfig.ConnRetriesDisabled).
func (c *Client) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return c.newStream(ctx, desc, cc, method, streamer, c.cfg.ConnRetriesDisabled, opts)
	}
}

// Breakers returns the group holding the breaker of each key, for metrics
// and manual control.
func (c *Client) Breakers() *breaker.Group { return c.breakers }

// Bulkheads returns the group holding the compartment of each key, nil
// when the Client has no bulkhead.
func (c *Client) Bulkheads() *bulkhead.Group { return c.bulkheads }

// RetryBudget returns the budget retries are spent from, for metrics.
func (c *Client) RetryBudget() *budget.Budget { return c.policy.BudgetInUse() }

// idempotent reports whether method may be sent twice: it is listed, its
// service is, or the call carries an idempotency key.
func (c *Client) idempotent(ctx context.Context, method string) bool {
	return c.listed(method) || keyed(ctx)
}

// listed reports whether method, or its service, is in IdempotentMethods.
func (c *Client) listed(method string) bool {
	if len(c.idem) > 0 {
		if c.idem[method] {
			return true
		}
		if i := strings.LastIndexByte(method, '/'); i > 0 && c.idem[method[:i+1]] {
			return true
		}
	}
	return false
}

// keyed reports whether the call carries an idempotency key.
func keyed(ctx context.Context) bool {
	return len(metadata.ValueFromOutgoingContext(ctx, MDIdempotencyKey)) > 0
}

// grpcRetries reports whether grpc-go retries method on cc itself (its
// service config has a retry policy for it): the call then gets one
// attempt of ours.
func grpcRetries(cc *grpc.ClientConn, method string, retriesOff bool) bool {
	return !retriesOff && cc != nil && cc.GetMethodConfig(method).RetryPolicy != nil
}

// call returns the per-call settings of the engine.
func (c *Client) call(cc *grpc.ClientConn, key string, idempotent bool) guardrail.Call {
	gc := guardrail.Call{Idempotent: guardrail.NotIdempotent, Dependency: c.cfg.Name, Breaker: c.breakers.Get(key)}
	if idempotent {
		gc.Idempotent = guardrail.Idempotent
	}
	if gc.Dependency == "" {
		gc.Dependency = key
	}
	if c.bulkheads != nil {
		gc.Bulkhead = c.bulkheads.Get(key)
	}
	return gc
}

// unaryCall is one unary call: its attempts share it. Pooled, so that a
// call allocates nothing of its own when its first attempt succeeds.
type unaryCall struct {
	c          *Client
	method     string
	req, reply any
	cc         *grpc.ClientConn
	invoker    grpc.UnaryInvoker
	idempotent bool
	keyed      bool // the call carries an idempotency key
	attempts   int
	trailer    metadata.MD
	peer       peer.Peer
	opts       []grpc.CallOption
	callerOpts int // the caller's options are opts[:callerOpts]
	info       Attempt
	trailerOpt grpc.TrailerCallOption
	peerOpt    grpc.PeerCallOption
	key        string // the breaker key, which the admission level is kept by
}

func (c *Client) invoke(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, retriesOff bool, opts []grpc.CallOption) error {
	listed, keyed := c.listed(method), keyed(ctx)
	idempotent := listed || keyed
	if c.cfg.Observer != nil && event.Operation(ctx) == "" {
		ctx = event.WithOperation(ctx, method)
	}
	key := c.key(cc, method)
	p := &c.policy
	gc := c.call(cc, key, idempotent)
	once := grpcRetries(cc, method, retriesOff)
	if once {
		gc.MaxAttempts = 1
	}
	// A call with an idempotency key is not hedged, though it is retried:
	// two copies in flight with one key meet the server's "same key in
	// flight" refusal (ABORTED), not a replay.
	if c.hedges && listed && !keyed && !once {
		if h := c.newHedgedCall(method, req, reply, cc, invoker, opts); h != nil {
			return h.invoke(ctx, p, gc)
		}
	}
	// DoCall never hedges: no attempt outlives the call, so its state can
	// be pooled.
	u := c.pool.Get().(*unaryCall)
	u.c, u.method, u.req, u.reply, u.cc, u.invoker = c, method, req, reply, cc, invoker
	u.idempotent, u.keyed = idempotent, keyed
	u.attempts, u.key = 0, key
	u.opts = append(u.opts[:0], opts...)
	u.callerOpts = len(opts)
	u.trailerOpt.TrailerAddr = &u.trailer
	u.peerOpt.PeerAddr = &u.peer
	u.opts = append(u.opts, u.trailerOpt)
	if !u.idempotent {
		// Whether a failed attempt got a transport stream tells whether it
		// may have reached the server.
		u.opts = append(u.opts, u.peerOpt)
	}
	_, err := guardrail.DoCall(ctx, p, gc, u.attempt)
	*u = unaryCall{opts: clearOpts(u.opts)}
	c.pool.Put(u)
	return finish(err)
}

// clearOpts drops the options' references so the pooled slice keeps no
// caller's value alive.
func clearOpts(o []grpc.CallOption) []grpc.CallOption {
	clear(o)
	return o[:0]
}

// attempt runs one attempt of a unary call.
func (u *unaryCall) attempt(ctx context.Context) (struct{}, error) {
	u.attempts++
	u.trailer, u.peer = nil, peer.Peer{}
	ctx = attemptContext(ctx, u.attempts)
	var err error
	if a := u.c.cfg.Attempt; a != nil {
		u.info = Attempt{Method: u.method, Req: u.req, Reply: u.reply, Conn: u.cc, Invoker: u.invoker,
			Idempotent: u.idempotent, Opts: u.opts, CallerOpts: u.opts[:u.callerOpts:u.callerOpts]}
		err = a(ctx, &u.info)
		u.info = Attempt{}
	} else {
		err = u.invoker(ctx, u.method, u.req, u.reply, u.cc, u.opts...)
	}
	if vs := u.trailer[chain.MDAdmission]; len(vs) > 0 {
		u.c.levels.Note(u.key, vs[0], true, time.Now())
	} else if u.c.levels.Seen() {
		u.c.levels.Note(u.key, "", false, time.Now())
	}
	if err == nil {
		return struct{}{}, nil
	}
	if ctx.Err() != nil {
		return struct{}{}, err // the engine judges its own deadline and the caller's
	}
	ae := u.c.failedAttempt(Result{Method: u.method, Err: err, Trailer: u.trailer, Sent: u.idempotent || u.peer.Addr != nil})
	if u.keyed {
		inFlight(ae, u.trailer)
	}
	return struct{}{}, ae
}

// inFlight turns ae, a failed attempt of a call that carried an
// idempotency key, into the engine's verdict for "the same key is still
// being processed" (guardrail.Verdict.InFlight) when it is ABORTED with a
// valid pushback, as guardgrpc's key interceptor answers, whatever the
// Classifier said: the call is retried with its key after the pushback.
// An ABORTED without a key, or without a valid pushback, stays final.
func inFlight(ae *attemptError, trailer metadata.MD) {
	if status.Code(ae.err) != codes.Aborted {
		return
	}
	d, present, ok := pushback(trailer)
	if !present || !ok {
		return
	}
	ae.v = guardrail.Verdict{Outcome: breaker.Ignored, InFlight: true, RetryAfter: d}
	ae.overload = false // a pushback, but not for load
}
