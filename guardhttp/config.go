package guardhttp

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"time"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/throttle"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
)

// Defaults used for zero Config fields. A connection that takes longer
// than 1.5 s to open, a TLS handshake or a request that takes longer than
// 3 s to send, and a server that takes longer than 5 s to start answering
// are, for a service calling another in the same region, a network or a
// dependency in trouble rather than a slow day.
const (
	DefaultConnectTimeout        = 1500 * time.Millisecond
	DefaultTLSHandshakeTimeout   = 3 * time.Second
	DefaultWriteTimeout          = 3 * time.Second
	DefaultResponseHeaderTimeout = 5 * time.Second
	// DefaultBodyIdleTimeout is twice the response-header timeout: a server
	// that has started to answer and then sends nothing for longer than we
	// let it think before answering has stalled, yet a body produced on the
	// fly (rows streamed from a cursor) has room to breathe. A stalled body
	// then holds a connection for seconds, not for as long as the server
	// cares to hang.
	DefaultBodyIdleTimeout = 10 * time.Second
	// DefaultMaxBufferedBody bounds the request body kept in memory so it
	// can be sent again.
	DefaultMaxBufferedBody = 1 << 20
	// DefaultDeadlineReserve is kept back from the time left when it is
	// announced to the server, for the answer's trip back.
	DefaultDeadlineReserve = 5 * time.Millisecond
	// DefaultMaxIdleConnsPerHost is the idle pool per host of the transport
	// NewClient builds: net/http's default of 2 makes a busy client close
	// and reopen connections all the time.
	DefaultMaxIdleConnsPerHost = 64
)

// maxDrain bounds what is read from a response thrown away for a retry so
// its connection can go back to the pool; a longer body costs the
// connection instead.
const maxDrain = 64 << 10

// Config configures a Transport. The zero value is ready to use and safe:
// 3 attempts with full jitter backoff, a retry budget of 10 %, the phase
// timeouts above, a circuit breaker per host, no retry of a request that is
// not idempotent unless it was never sent.
//
// The retry settings are those of guardrail.Policy, which the Transport
// builds and owns: it decides per request what a Policy fixes per call site
// (which requests are idempotent, how a response is classified), and it
// names the phase of timeouts in events, so it cannot take a Policy from
// outside. Share a Budget, an Observer or Breakers between transports
// through the fields below.
//
// A Config is a plain value: NewTransport and NewClient validate it and
// read it once, so changing it afterwards has no effect; the values it
// points to (Budget, Observer, Breakers, Classify, Key) must be safe for
// concurrent use. An invalid field makes them return an error that names
// it and Is ErrInvalidConfig.
type Config struct {
	// Name labels the dependency in events and errors. Empty means each
	// request's key (see Key): by default the URL's host. It becomes a
	// metric label: keep it to a small fixed set.
	Name string

	// Retry is how requests retry, as in guardrail.Policy. For a request,
	// an attempt lasts from its start until its response body is read or
	// closed, and AttemptTimeout bounds all of it, on top of the phase
	// timeouts; a nil Budget means a budget of this Transport alone.
	guardrail.Retry

	// Observer receives the events of every request; an event.Timeout names the
	// phase that expired. Nil costs nothing.
	Observer event.Observer

	// ConnectTimeout bounds getting a connection: DNS, waiting for the pool,
	// dialing. Zero means DefaultConnectTimeout; negative means no limit.
	ConnectTimeout time.Duration

	// TLSHandshakeTimeout bounds the TLS handshake. Zero means
	// DefaultTLSHandshakeTimeout; negative means no limit.
	TLSHandshakeTimeout time.Duration

	// WriteTimeout bounds sending the request, headers and body, once a
	// connection is in hand. Zero means DefaultWriteTimeout; negative means
	// no limit.
	WriteTimeout time.Duration

	// ResponseHeaderTimeout bounds the wait for the response headers after
	// the request was written. Zero means DefaultResponseHeaderTimeout;
	// negative means no limit.
	ResponseHeaderTimeout time.Duration

	// BodyIdleTimeout bounds each wait for response body data: a Read of
	// the body that gets nothing for that long fails with a TimeoutError.
	// Time the caller spends between Reads does not count. Zero means
	// DefaultBodyIdleTimeout; negative means no limit (streams that may be
	// silent for long, such as server-sent events).
	BodyIdleTimeout time.Duration

	// MaxBufferedBody is the largest request body without GetBody that is
	// kept in memory to be sent again on a retry. A larger body is sent once
	// and its request is never retried. Zero means DefaultMaxBufferedBody;
	// a negative value is invalid (an unbounded buffer would let one large
	// upload take the process's memory). A body with GetBody, such as
	// bytes.Reader's, is never buffered.
	MaxBufferedBody int64

	// IdempotencyKeys, when true, gives a POST or PATCH that has no
	// Idempotency-Key header a random one (128 bits from crypto/rand), the
	// same on every attempt of the request, which makes it retryable. The
	// server must honour the key (deduplicate by it), or a retry may run the
	// operation twice. A request that fails carries its key in an
	// *IdempotencyKeyError; one that got a response, in
	// resp.Request.Header. A key made here is random and lives as long as
	// the request: for an intent the caller may send again later, derive
	// the key from a business ID (an order ID) and set the header itself.
	IdempotencyKeys bool

	// DeadlineReserve is subtracted from the time left before it is
	// announced to the server in X-Request-Timeout and X-Request-Deadline.
	// Zero means DefaultDeadlineReserve; negative means none.
	DeadlineReserve time.Duration

	// Classify decides what an attempt's response or error means. Nil means
	// DefaultClassify.
	Classify Classifier

	// Key returns a request's failure domain: its breaker and bulkhead
	// key, and its dependency label when Name is empty. Return a route, a
	// shard or a region to split one host. Nil means the URL's host
	// (with its port, if the URL has one). Keep the set of keys small.
	Key func(*http.Request) string

	// Breakers holds one circuit breaker per key, so that one failing host
	// (or route, or shard) does not stop calls to the others: one breaker
	// for a whole HTTP client would let one bad host cut off every healthy
	// one. Nil means a group of this
	// Transport's own with breaker's defaults: 10 s window, at least 20
	// calls, 50 % failures, open 30 s plus up to 20 % jitter, one probe,
	// at most breaker.DefaultMaxKeys keys; its transitions go to Observer.
	// To tune the breakers, set Breaker instead: the Transport then builds
	// the group and keeps reporting its transitions to Observer. Pass a
	// group to share the breakers between transports (subscribe to its
	// transitions yourself); a group whose Config.Mode is breaker.Disabled
	// turns breakers off.
	Breakers *breaker.Group

	// Breaker configures the breaker of every key of the group the
	// Transport builds when Breakers is nil; each breaker gets the key as
	// its Name. The zero value means breaker's defaults. Every transition
	// goes to Observer as an event.BreakerTransition whose Dependency is
	// Name (the key when Name is empty); leave Breaker.Observer nil, or it
	// gets each transition as well, under the key, before Observer. It is invalid to set both Breaker and Breakers: the group
	// has its own configuration.
	Breaker breaker.Config

	// Bulkhead, when not nil, gives each key a concurrency compartment so
	// configured: at most MaxConcurrent attempts in flight to it, at most
	// MaxQueue waiting, none past MaxWait or the time left minus
	// MinAttemptTime. An attempt holds its slot until its response body is
	// read or closed: a slow download holds a connection too. A request
	// refused fails with an error that Is guardrail.ErrBulkheadFull and is
	// not retried. Nil means no bound.
	//
	// It is a configuration, where guardrail.Policy.Bulkhead is a
	// *bulkhead.Bulkhead, because a Transport calls many failure domains
	// (one per key) and builds a compartment for each as keys appear; a
	// Policy guards one dependency and shares the one it is given.
	Bulkhead *bulkhead.Config

	// Hedge, when not nil, hedges requests of an idempotent method (GET,
	// HEAD, PUT, DELETE, OPTIONS; not a POST or PATCH, key or not) whose
	// body can be sent again: after a delay without response headers another attempt
	// is sent and the first success is returned; the losers are cancelled
	// and their response bodies closed, which frees their connections. It
	// switches itself off under overload (429, 503, Retry-After), when the
	// retry budget is low and while the key's breaker is not closed. See
	// guardrail.HedgeConfig. Nil means no hedging.
	Hedge *guardrail.HedgeConfig

	// Throttler, when not nil, rejects attempts locally with an error that
	// Is guardrail.ErrThrottled when the dependency has lately accepted too
	// few (429 and 503 answers and timeouts are not accepts): see
	// throttle.Throttler. It is one throttle for every key of the
	// Transport: give each dependency a Transport of its own, or a
	// Throttler of its own. Nil means no throttling.
	Throttler *throttle.Throttler
}

// settings are a Config with defaults applied.
type settings struct {
	name           string
	attemptTimeout time.Duration
	connect        time.Duration // <= 0: no limit
	tls            time.Duration
	write          time.Duration
	header         time.Duration
	bodyIdle       time.Duration
	maxBuffered    int64 // < 0: never
	maxAttempts    int
	generateKeys   bool
	reserve        time.Duration
	classify       Classifier
	key            func(*http.Request) string
}

func (c *Config) settings() settings {
	s := settings{
		name:           c.Name,
		attemptTimeout: c.AttemptTimeout,
		connect:        orDefault(c.ConnectTimeout, DefaultConnectTimeout),
		tls:            orDefault(c.TLSHandshakeTimeout, DefaultTLSHandshakeTimeout),
		write:          orDefault(c.WriteTimeout, DefaultWriteTimeout),
		header:         orDefault(c.ResponseHeaderTimeout, DefaultResponseHeaderTimeout),
		bodyIdle:       orDefault(c.BodyIdleTimeout, DefaultBodyIdleTimeout),
		maxBuffered:    c.MaxBufferedBody,
		maxAttempts:    c.MaxAttempts,
		generateKeys:   c.IdempotencyKeys,
		reserve:        orDefault(c.DeadlineReserve, DefaultDeadlineReserve),
		classify:       c.Classify,
		key:            c.Key,
	}
	if s.maxBuffered == 0 {
		s.maxBuffered = DefaultMaxBufferedBody
	}
	if s.maxAttempts == 0 {
		s.maxAttempts = guardrail.DefaultMaxAttempts
	}
	if s.reserve < 0 {
		s.reserve = 0
	}
	if s.classify == nil {
		s.classify = DefaultClassify
	}
	return s
}

// ErrInvalidConfig is the sentinel every error of NewTransport and
// NewClient about their Config Is.
var ErrInvalidConfig = errors.New("guardhttp: invalid config")

// configError is an invalid field of a Config; err is the cause, when
// the field is the configuration of another package.
type configError struct {
	msg string
	err error
}

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }
func (e *configError) Unwrap() error        { return e.err }

// validate reports every invalid field of c. The phase timeouts, the
// minimum attempt time, the reserve and MaxRetryAfter cannot be invalid:
// zero is their default, negative turns them off.
func (c *Config) validate() error {
	var errs []error
	bad := func(msg string, err error) {
		errs = append(errs, &configError{msg: "guardhttp: Config." + msg, err: err})
	}
	if err := c.Retry.Validate("guardhttp: Config"); err != nil {
		errs = append(errs, &configError{msg: err.Error(), err: err})
	}
	if c.MaxBufferedBody < 0 {
		bad(fmt.Sprintf("MaxBufferedBody is %d; want 0 (the default, %d bytes) or more", c.MaxBufferedBody, DefaultMaxBufferedBody), nil)
	}
	if c.Hedge != nil {
		if err := c.Hedge.Validate(); err != nil {
			bad("Hedge: "+err.Error(), err)
		}
	}
	if !reflect.ValueOf(c.Breaker).IsZero() {
		if c.Breakers != nil {
			bad("Breaker and Config.Breakers are both set; want one: a group brings its own breaker configuration", nil)
		}
		if _, err := breaker.New(c.Breaker); err != nil {
			bad("Breaker: "+err.Error(), err)
		}
	}
	if c.Bulkhead != nil {
		if _, err := bulkhead.New(*c.Bulkhead); err != nil {
			bad("Bulkhead: "+err.Error(), err)
		}
	}
	return errors.Join(errs...)
}

// orDefault maps zero to def and a negative d to 0, "no limit".
func orDefault(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}
