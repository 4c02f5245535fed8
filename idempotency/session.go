package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/guardrail-go/guardrail/event"
)

// KeysConfig configures Keys; NewKeys copies it. Every zero field means
// the default its comment gives. It is a plain value, safe to share while
// nobody modifies it.
type KeysConfig struct {
	// Name names the protected service in events (event.Event.Dependency).
	// Empty leaves Dependency empty.
	Name string

	// TTL is how long a completed answer, or an unknown outcome, is kept
	// for replay. Zero means 24 hours; negative is invalid.
	TTL time.Duration

	// Lease is how long a key stays locked without renewal, so that a
	// crashed holder frees it. When the context given to Begin has a
	// deadline later than Lease from now, the lease is that deadline plus
	// one second instead. Zero means 30 seconds; negative is invalid.
	Lease time.Duration

	// DisableLeaseRenewal turns off lease renewal: by default a Session
	// extends its lease every third of it (on a timer, not a goroutine)
	// until it ends, so a slow handler keeps its key however long it
	// runs. With renewal off a handler that outlives its lease loses the
	// key, and a retry after the lease runs the request a second time.
	DisableLeaseRenewal bool

	// CancelOnLeaseLost cancels the Session's context, with an error
	// matching ErrLeaseLost as the cause, as soon as its lease is known
	// lost: when a renewal or Confirm finds the lock lost, or when the
	// lease's end passes without a renewal. False leaves the context
	// alone; the handler can still ask with Held and Confirm.
	CancelOnLeaseLost bool

	// StoreTimeout bounds each store call, lease renewals included. Zero
	// means 2 seconds; negative is invalid.
	StoreTimeout time.Duration

	// MaxKeysPerScope caps the live keys, in flight and completed, that
	// one caller (the first part of Request.Scope) holds in the store, so
	// that one caller can never fill it for the others: Begin then
	// returns an error that Is ErrScopeFull for the caller's new keys
	// until some of its keys are released or expire. Zero means 10,000;
	// negative means no limit. It applies only with a ScopedStore, and
	// only to requests whose first Scope part is not empty (with one
	// tenant there is no other caller to protect).
	MaxKeysPerScope int

	// Logger receives store failures, failed renewals and lost leases.
	// Nil means slog.Default().
	Logger *slog.Logger

	// Observer receives an event.Idempotency event per decision, with
	// Name as its Dependency. Nil means none.
	Observer event.Observer
}

// Keys is the idempotency protocol on a Store, whatever the transport:
// the HTTP middleware (Server) and the gRPC interceptor of guardgrpc are
// both thin mappings onto it, and a transport of your own can be one too.
// Begin looks a request's key up and, when the key is free, returns the
// Session that holds it while the request runs; the Session then stores
// the answer, or releases the key, or records that the outcome is
// unknown. Keys is safe for concurrent use.
//
// Which answers are stored and which release the key is one rule for
// every transport, applied by Session.Complete to Response.Status, the
// answer's class in HTTP terms: a success (2xx), a redirect (3xx) and a
// definite refusal (4xx) are stored and replayed for TTL; an answer that
// says the request was not processed, or may succeed later, releases the
// key so that a retry runs the request again: 408 Request Timeout, 425
// Too Early, 429 Too Many Requests, and every 5xx. A transport that does
// not speak HTTP maps each of its answers to the status of the same
// meaning (guardgrpc maps RESOURCE_EXHAUSTED to 429, UNAVAILABLE to 503).
type Keys struct {
	store        Store
	name         string
	ttl          time.Duration
	lease        time.Duration
	storeTimeout time.Duration
	maxKeys      int // per scope; negative means no limit
	renew        bool
	cancelOnLost bool
	log          *slog.Logger
	obs          event.Observer
}

// Defaults used for zero fields.
const (
	defaultTTL          = 24 * time.Hour
	defaultLease        = 30 * time.Second
	defaultStoreTimeout = 2 * time.Second
	// defaultMaxKeysPerScope lets a caller keep about 7 keyed requests a
	// minute for the default TTL of 24 hours.
	defaultMaxKeysPerScope = 10_000
)

// NewKeys returns Keys that keep their keys in store, configured by cfg.
// It returns an error if store is nil, and one that Is ErrInvalidConfig,
// naming every invalid field, when cfg is invalid.
func NewKeys(store Store, cfg KeysConfig) (*Keys, error) {
	if store == nil {
		return nil, errors.New("idempotency: NewKeys: nil Store")
	}
	if err := errors.Join(checkDurations("KeysConfig.", cfg.TTL, cfg.Lease, cfg.StoreTimeout)...); err != nil {
		return nil, err
	}
	return newKeys(store, cfg), nil
}

// checkDurations reports the invalid ones of TTL, Lease and StoreTimeout,
// named after prefix.
func checkDurations(prefix string, ttl, lease, storeTimeout time.Duration) []error {
	var errs []error
	for _, f := range [...]struct {
		name   string
		v, def time.Duration
	}{{"TTL", ttl, defaultTTL}, {"Lease", lease, defaultLease}, {"StoreTimeout", storeTimeout, defaultStoreTimeout}} {
		if f.v < 0 {
			errs = append(errs, invalid("%s%s is %v; want a positive duration, or 0 for %v", prefix, f.name, f.v, f.def))
		}
	}
	return errs
}

// newKeys builds Keys from a cfg already checked.
func newKeys(store Store, cfg KeysConfig) *Keys {
	k := &Keys{
		store:        store,
		name:         cfg.Name,
		ttl:          orDefault(cfg.TTL, defaultTTL),
		lease:        orDefault(cfg.Lease, defaultLease),
		storeTimeout: orDefault(cfg.StoreTimeout, defaultStoreTimeout),
		maxKeys:      orDefault(cfg.MaxKeysPerScope, defaultMaxKeysPerScope),
		renew:        !cfg.DisableLeaseRenewal,
		cancelOnLost: cfg.CancelOnLeaseLost,
		log:          cfg.Logger,
		obs:          cfg.Observer,
	}
	if k.log == nil {
		k.log = slog.Default()
	}
	return k
}

// Request is what Begin needs to know of a request. It is a plain value.
type Request struct {
	// Scope names whose key it is and what it asks for: the caller (a
	// user, tenant or API key ID from the authenticated request; never
	// from a field the client chooses freely), then the operation (a
	// method and route, a gRPC method). The store's key is a hash of the
	// parts, each length-prefixed, and of Key, so one caller can never
	// reach another's answer, and reusing a key for another operation is
	// another key.
	Scope []string
	// Key is the client's idempotency key, as ParseKey returns it.
	Key string
	// Fingerprint identifies the request's payload; the same key with
	// another fingerprint is StateMismatch.
	Fingerprint Fingerprint
	// Operation is the events' Operation. Empty means event.Operation of
	// Begin's context.
	Operation string
}

// Begin looks req's key up in the store and, when it is free, locks it
// with a lease and returns the Session that holds it. The Result says
// which case it found:
//
//   - StateAcquired: the Session is not nil; run the request with
//     Session.Context, then end the Session with Complete, Release or
//     Unknown (exactly one; later calls do nothing);
//   - StateCompleted: the key completed with the same fingerprint;
//     Result.Response is the stored answer to replay (an unknown outcome
//     is one too, as the transport recorded it with Session.Unknown);
//   - StateInFlight: another request holds the key; Result.RetryIn is the
//     time left on its lease, a fair delay to ask the client to wait;
//   - StateMismatch: the key was used with another fingerprint.
//
// Only StateAcquired returns a Session. When the caller's scope holds
// MaxKeysPerScope keys, Begin returns an error that Is ErrScopeFull, with
// Result.RetryIn the time until one of them expires (zero if unknown):
// the transport refuses the request as over a quota (HTTP 429), never runs
// it unprotected, since the store works. Begin returns the store's error,
// and no Session, when the store fails or returns an invalid result; the
// transport then refuses the request as unavailable, or runs it
// unprotected (with Unprotected's context). Begin emits the event of its
// decision (conflict, replayed, mismatch, rate_limit, store_error),
// except when ctx is done: the client is gone, and nothing ran.
func (k *Keys) Begin(ctx context.Context, req Request) (Result, *Session, error) {
	op := req.Operation
	if op == "" {
		op = event.Operation(ctx)
	}
	return k.begin(ctx, op, func() []slog.Attr { return []slog.Attr{slog.String("operation", op)} }, req.Scope, req.Key, req.Fingerprint)
}

// begin is Begin with the events' operation, and attrs, which returns the
// attributes of the session's log lines: called only when the key is
// acquired, so that a replay or a conflict allocates none.
func (k *Keys) begin(ctx context.Context, op string, attrs func() []slog.Attr, scope []string, key string, fp Fingerprint) (Result, *Session, error) {
	skey := scopedKey(scope, key)
	lease := k.leaseFor(ctx)
	begun := time.Now()
	bctx, cancel := context.WithTimeout(ctx, k.storeTimeout)
	var res Result
	var err error
	if ss, ok := k.store.(ScopedStore); ok && len(scope) > 0 && scope[0] != "" {
		res, err = ss.BeginScoped(bctx, scopeID(scope[0]), skey, fp, lease, k.maxKeys)
	} else {
		res, err = k.store.Begin(bctx, skey, fp, lease)
	}
	cancel()
	if errors.Is(err, ErrScopeFull) {
		if ctx.Err() == nil {
			k.emit(ctx, op, event.ReasonRateLimit, err)
		}
		return Result{RetryIn: max(res.RetryIn, 0)}, nil, err
	}
	if err == nil && (res.State < StateAcquired || res.State > StateMismatch ||
		res.State == StateCompleted && (res.Response == nil || res.Response.Status < 100 || res.Response.Status > 999)) {
		err = fmt.Errorf("idempotency: store returned invalid result %v", res.State)
	}
	if err != nil {
		if ctx.Err() == nil {
			k.emit(ctx, op, event.ReasonStoreError, err)
		}
		return Result{}, nil, err
	}
	switch res.State {
	case StateInFlight:
		k.emit(ctx, op, event.ReasonConflict, nil)
	case StateCompleted:
		k.emit(ctx, op, event.ReasonReplayed, nil)
	case StateMismatch:
		k.emit(ctx, op, event.ReasonMismatch, nil)
	case StateAcquired:
		return res, k.start(ctx, op, attrs(), skey, res.Token, lease, begun), nil
	}
	return res, nil, nil
}

func (k *Keys) leaseFor(ctx context.Context) time.Duration {
	lease := k.lease
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl) + time.Second; d > lease {
			lease = d
		}
	}
	return lease
}

func (k *Keys) emit(ctx context.Context, op, reason string, err error) {
	if k.obs == nil {
		return
	}
	k.obs.Observe(ctx, event.Event{
		Kind:       event.Idempotency,
		Dependency: k.name,
		Operation:  op,
		Reason:     reason,
		Err:        err,
	})
}

// releases is the one classification of answers, for every transport: it
// reports whether an answer of class status (an HTTP status; other
// transports map theirs onto it) says that the request was not processed,
// or may succeed if sent again, so that its key is released and a retry
// runs the request again, rather than the answer stored and replayed for
// TTL.
//
//   - 408 Request Timeout: the server gave up waiting for the request; it
//     did not process it.
//   - 425 Too Early: the server refused to process a request sent in early
//     data; the client is to send it again.
//   - 429 Too Many Requests: refused by a rate limit or quota, not
//     processed; Retry-After says when to come back. Storing it would
//     answer every retry with the key with the refusal for TTL, long after
//     the limit has passed.
//   - 5xx: the server failed, or was unavailable, and the answer is not
//     the outcome of the operation: a retry may succeed. A handler that
//     committed must answer its commit, not a 5xx.
//
// Everything else is definite, and stored: 2xx and 3xx, and every other
// 4xx (the request is wrong, or conflicts with the resource, and sending
// it again changes nothing).
func releases(status int) bool {
	switch status {
	case 408, 425, 429:
		return true
	}
	return status >= 500
}

// Session is one request's hold on its key, from Begin to its end. While
// the request runs its lease is renewed (see KeysConfig.Lease), and its
// Context carries it, so that Held, Confirm and Release work from the
// handler. End it with exactly one of Complete, Release and Unknown; a
// second end does nothing. It is safe for concurrent use.
type Session struct {
	renewal
}

// Context returns the context to run the request with: the context given
// to Begin, with the lease for Held, Confirm and Release, and, with
// KeysConfig.CancelOnLeaseLost, cancelled as soon as the lease is lost.
func (s *Session) Context() context.Context { return s.hctx }

// Complete ends the session with the request's answer: it is stored, to
// be replayed for TTL to every retry with the key, unless its Status is
// one that releases the key (408, 425, 429, 5xx; see Keys) or the
// handler called Release, and then the key is released instead. A store
// failure, or a lease lost meanwhile, is logged and emitted; the answer
// is still the request's to send. Complete stops lease renewal first, and
// waits for a renewal in flight.
func (s *Session) Complete(resp *Response) {
	if !s.end() {
		return
	}
	switch released := s.stop(true); {
	case released:
		s.release("released by the handler")
		return
	case resp == nil:
		s.release("no answer")
		return
	case releases(resp.Status):
		s.release("status " + strconv.Itoa(resp.Status))
		return
	}
	ctx, cancel := s.detached()
	defer cancel()
	if err := s.k.store.Complete(ctx, s.key, s.token, resp, s.k.ttl); err != nil {
		s.k.emit(s.ctx, s.op, event.ReasonStoreError, err)
		msg := "idempotency: storing the response failed; a retry may run the request again"
		switch {
		case errors.Is(err, ErrLockLost) && !s.k.renew:
			msg = "idempotency: the key's lease expired before the handler finished; a retry may run the request again (raise the lease above the handler's longest run, or turn lease renewal back on)"
		case errors.Is(err, ErrLockLost):
			msg = "idempotency: the key's lease expired before the handler finished (its renewal failed or found it lost; see the earlier log lines); a retry may run the request again"
		}
		s.k.log.ErrorContext(s.ctx, msg, s.with("err", err, "status", resp.Status)...)
		return
	}
	s.k.emit(s.ctx, s.op, event.ReasonStored, nil)
}

// Release ends the session by freeing its key, so that a retry with it
// runs the request again: call it when the request committed nothing (its
// client went away before it did anything, the answer cannot be
// recorded). why is logged. A key that is no longer the session's (its
// lease ended, a retry took it over, the store forgot it) has nothing to
// release: that is logged as a warning, not a store failure, and changes
// nothing for the answer.
func (s *Session) Release(why string) {
	if !s.end() {
		return
	}
	s.stop(true)
	s.release(why)
}

// Unknown ends the session of a request whose outcome is unknown (it
// panicked, or its connection was taken over): it may have committed
// before, and nothing says whether it did, so the key is not released but
// completed with resp, the transport's "outcome unknown" answer, replayed
// to every retry for TTL without running the request; unless the handler
// called Release, and then the key is released. resp is stored whatever
// its Status. why is logged.
func (s *Session) Unknown(resp *Response, why string) { s.settle(true, resp, why) }

// settle is Unknown; cancelContext says whether to cancel the handler's
// context (a hijacked connection's handler still runs).
func (s *Session) settle(cancelContext bool, resp *Response, why string) {
	if !s.end() {
		return
	}
	if s.stop(cancelContext) {
		s.release(why + " after Release")
		return
	}
	ctx, cancel := s.detached()
	defer cancel()
	s.k.emit(s.ctx, s.op, event.ReasonOutcomeUnknown, nil)
	if err := s.k.store.Complete(ctx, s.key, s.token, resp, s.k.ttl); err != nil {
		if !errors.Is(err, ErrLockLost) {
			s.k.emit(s.ctx, s.op, event.ReasonStoreError, err)
		}
		s.k.log.ErrorContext(s.ctx, "idempotency: the handler's outcome is unknown and recording that failed; a retry may run the request again",
			s.with("err", err, "why", why)...)
		return
	}
	s.k.log.WarnContext(s.ctx, "idempotency: the handler's outcome is unknown; retries with its key get the outcome-unknown answer until the key expires, without running the handler",
		s.with("why", why, "ttl", s.k.ttl)...)
}

// end marks the session ended and reports whether it was still running.
func (s *Session) end() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finished {
		return false
	}
	s.finished = true
	return true
}

// release frees the key; renewal has stopped.
func (s *Session) release(why string) {
	ctx, cancel := s.detached()
	defer cancel()
	if err := s.k.store.Release(ctx, s.key, s.token); err != nil {
		if errors.Is(err, ErrLockLost) {
			// The store works; the key was simply no longer this
			// request's to release: someone else's now, or free.
			s.k.log.WarnContext(s.ctx, "idempotency: the key was no longer held when releasing it (its lease had ended, or a retry took it over); nothing to release",
				s.with("why", why)...)
			return
		}
		s.k.emit(s.ctx, s.op, event.ReasonStoreError, err)
		s.k.log.ErrorContext(s.ctx, "idempotency: releasing the key failed; retries are told it is in flight until its lease ends",
			s.with("err", err, "why", why)...)
		return
	}
	s.k.emit(s.ctx, s.op, event.ReasonReleased, nil)
}

// detached returns a context for finishing the key: it keeps the
// request's values but not its cancellation, because the client's
// connection being cut (the very case keys exist for) must not stop the
// answer from being stored.
func (s *Session) detached() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(s.ctx), s.k.storeTimeout)
}
