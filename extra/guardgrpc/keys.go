package guardgrpc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/idempotency"
)

// KeyConfig configures idempotency keys on unary calls: the gRPC mapping
// of the idempotency package's protocol (idempotency.Keys), on the same
// Store and with the same semantics as its HTTP middleware. A call
// carrying an idempotency-key runs its handler once per key; a retry with
// the same key and request gets the stored answer (with the header
// idempotent-replayed: true, idempotency.HeaderReplayed); the same key
// while the first call runs gets ABORTED with a pushback; the same key
// with another request gets FAILED_PRECONDITION; a malformed key gets
// INVALID_ARGUMENT; a call that Scope cannot attribute to a caller gets
// PERMISSION_DENIED; a store failure gets UNAVAILABLE with a pushback (or
// runs unprotected with FailOpen).
//
// Which answers are stored is the one table every transport shares (see
// idempotency.Keys and docs/idempotency.md): a success and a definite
// refusal (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE,
// UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND, ALREADY_EXISTS, CANCELLED
// by the handler), status details included, are stored and replayed for
// TTL. An answer that says the call was not processed, or may succeed if
// sent again, releases the key so that a retry runs the handler again, as
// a 429 or a 5xx does over HTTP: RESOURCE_EXHAUSTED (a quota: come back
// later), UNAVAILABLE, ABORTED (a concurrency conflict aborted it, and
// nothing was committed), DEADLINE_EXCEEDED, UNIMPLEMENTED, and the
// server's failures (UNKNOWN, INTERNAL, DATA_LOSS); so does a handler that
// answers CANCELLED after its client went away.
//
// A panic is neither: the handler may have committed its side effect
// before it panicked, and nothing says whether it did, so releasing the
// key would let the retry commit it a second time. The key is instead
// completed with an unknown outcome: for TTL every retry with it gets,
// without the handler running, INTERNAL "outcome unknown for this
// idempotency-key" with idempotent-replayed: true, and the caller has to
// find out what happened before trying again with a new key. The panic is
// then re-raised, so a recovering interceptor outside this one (or the
// process) sees it as before. A handler that knows it committed nothing
// calls idempotency.Release first: its key is then released however it
// ends. idempotency.Held and idempotency.Confirm work in the handler as
// they do over HTTP: the call's key is renewed while the handler runs.
//
// A KeyConfig is a plain value that NewServer reads once, safe to share;
// its Store, Scope and NewReply must be safe for concurrent use. NewServer
// refuses a KeyConfig that sets neither Scope nor SingleTenant, naming
// every invalid field.
type KeyConfig struct {
	// Store holds the keys. Required.
	Store idempotency.Store

	// Methods are the full method names whose calls are deduplicated. Nil
	// means every unary method: a key is the client's request for it.
	Methods []string

	// Required makes a key mandatory for Methods: a call without one gets
	// INVALID_ARGUMENT. False lets such calls through unprotected.
	Required bool

	// Scope returns who is calling: a user, tenant or API key ID from the
	// authenticated context (peer credentials, or what an authentication
	// interceptor before this one put there). Keys are scoped by it, so one
	// caller can never replay another's stored answer, nor block or probe
	// another's key. It must not return an empty scope: an error, or an
	// empty string, means the call cannot be attributed to a caller (the
	// interceptor runs before authentication, or the call is anonymous),
	// and the call gets PERMISSION_DENIED without its handler running,
	// since looking its key up in any shared scope could hand it someone
	// else's answer; the error is logged, not sent. PERMISSION_DENIED
	// rather than UNAUTHENTICATED because the call may well carry valid
	// credentials: what is refused is deduplicating it without a scope, as
	// the HTTP middleware's 403 does. Return a fixed name such as
	// "anonymous" to let anonymous calls share one scope on purpose. It is
	// called only for calls that carry a key, before the request is
	// fingerprinted. Exactly one of Scope and SingleTenant must be set.
	Scope func(ctx context.Context) (string, error)

	// MaxKeysPerScope caps the live keys, in flight and completed, that
	// one caller (one Scope) holds in the store, so that one caller sending
	// new keys can never fill it for the others, as
	// idempotency.Config.MaxKeysPerScope does over HTTP. A caller at its
	// quota gets RESOURCE_EXHAUSTED, with the time until its first key
	// expires as the pushback, for a new key, without its handler running,
	// whatever FailOpen says; its retries of live keys are still answered.
	// Zero means 10,000; negative means no limit. It applies with a store
	// that implements idempotency.ScopedStore, and not with SingleTenant.
	MaxKeysPerScope int

	// SingleTenant puts every call in one key scope. Set it only when every
	// caller is trusted alike (one internal client, one service account):
	// any caller that learns a key can then be replayed the answer stored
	// for it, and keys protect each other only by being unguessable.
	// Exactly one of Scope and SingleTenant must be set.
	SingleTenant bool

	// NewReply returns an empty response message of method, to replay a
	// stored success into. Nil means the type registered for the method's
	// output in protoregistry.GlobalFiles and GlobalTypes, which generated
	// code does.
	NewReply func(method string) (proto.Message, error)

	// MaxKeyLength caps the key's length in bytes. Zero means 255, as over
	// HTTP; negative is invalid.
	MaxKeyLength int

	// TTL is how long an answer, or an unknown outcome (a panic), is kept
	// for replay. Zero means 24 hours; negative is invalid.
	TTL time.Duration

	// Lease is how long a key stays locked without renewal; while the
	// handler runs it is renewed every third of it. A call whose deadline
	// is later than Lease from now gets that deadline plus one second.
	// Zero means 30 seconds; negative is invalid.
	Lease time.Duration

	// CancelOnLeaseLost cancels the handler's context as soon as its
	// key's lease is known lost, with an error matching
	// idempotency.ErrLeaseLost as the cause, as
	// idempotency.Config.CancelOnLeaseLost does over HTTP. False leaves
	// the context alone; the handler can still ask with idempotency.Held
	// and idempotency.Confirm.
	CancelOnLeaseLost bool

	// StoreTimeout bounds each store call. Zero means 2 seconds; negative
	// is invalid.
	StoreTimeout time.Duration

	// RetryAfter is the pushback sent when the store fails, and the most
	// sent while the key is in flight. Zero means 1 second; negative is
	// invalid.
	RetryAfter time.Duration

	// FailOpen runs calls unprotected when the store fails, instead of
	// refusing them. A retry may then run twice.
	FailOpen bool

	// Logger receives store failures, failed lease renewals and lost
	// leases. Nil means slog.Default().
	Logger *slog.Logger
}

type keys struct {
	cfg     KeyConfig
	keys    *idempotency.Keys
	methods map[string]bool // nil: all
	maxLen  int
	retry   time.Duration
	log     *slog.Logger
	replies sync.Map // method -> protoreflect.MessageType
}

func newKeys(cfg KeyConfig, obs event.Observer) (*keys, error) {
	var errs []error
	if cfg.Store == nil {
		errs = append(errs, invalid("KeyConfig.Store is nil; want an idempotency.Store"))
	}
	switch {
	case cfg.Scope == nil && !cfg.SingleTenant:
		errs = append(errs, invalid("KeyConfig.Scope is nil and KeyConfig.SingleTenant is false; want exactly one of them: "+
			"without a scope every caller's keys would share one namespace, and a caller who learnt another's key "+
			"would be replayed that caller's stored answer (set Scope to return the authenticated caller, or "+
			"SingleTenant when every caller is trusted alike)"))
	case cfg.Scope != nil && cfg.SingleTenant:
		errs = append(errs, invalid("KeyConfig.Scope is set and KeyConfig.SingleTenant is true; want exactly one of them: "+
			"SingleTenant puts every caller in one scope, which contradicts scoping keys by caller"))
	}
	for _, f := range [...]struct {
		name string
		v    time.Duration
	}{{"TTL", cfg.TTL}, {"Lease", cfg.Lease}, {"StoreTimeout", cfg.StoreTimeout}, {"RetryAfter", cfg.RetryAfter}} {
		if f.v < 0 {
			errs = append(errs, invalid("KeyConfig.%s is %v; want 0 (the default) or more", f.name, f.v))
		}
	}
	if cfg.MaxKeyLength < 0 {
		errs = append(errs, invalid("KeyConfig.MaxKeyLength is %d; want 0 (the default) or more", cfg.MaxKeyLength))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ks, err := idempotency.NewKeys(cfg.Store, idempotency.KeysConfig{
		TTL: cfg.TTL, Lease: cfg.Lease, StoreTimeout: cfg.StoreTimeout,
		CancelOnLeaseLost: cfg.CancelOnLeaseLost, MaxKeysPerScope: cfg.MaxKeysPerScope,
		Logger: cfg.Logger, Observer: obs,
	})
	if err != nil {
		return nil, err
	}
	k := &keys{cfg: cfg, keys: ks, maxLen: cfg.MaxKeyLength, retry: cfg.RetryAfter, log: cfg.Logger}
	if k.retry == 0 {
		k.retry = time.Second
	}
	if cfg.Methods != nil {
		k.methods = make(map[string]bool, len(cfg.Methods))
		for _, m := range cfg.Methods {
			k.methods[m] = true
		}
	}
	if k.log == nil {
		k.log = slog.Default()
	}
	return k, nil
}

// hashParts hashes length-prefixed parts with SHA-256, so that no part can
// run into the next.
func hashParts(parts ...[]byte) [sha256.Size]byte {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, p := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		h.Write(p)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// answerStatus is gRPC's half of the one table of stored and released
// answers (see idempotency.Keys): the HTTP status of the same meaning,
// under which an answer with code c is recorded, and which decides, by
// the rule every transport shares, whether it is stored and replayed
// (2xx, 4xx) or releases the key so that a retry runs the call again
// (408, 425, 429, 5xx). The gRPC status itself is in the stored body. The
// statuses are google.rpc.Code's HTTP mapping, but for ABORTED.
func answerStatus(c codes.Code) int {
	switch c {
	// Stored: the call was processed, and its answer is the outcome.
	case codes.OK:
		return 200
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return 400 // the request is wrong, or the system is not in a state to run it: sending it again changes nothing
	case codes.Unauthenticated:
		return 401
	case codes.PermissionDenied:
		return 403
	case codes.NotFound:
		return 404
	case codes.AlreadyExists:
		return 409
	case codes.Canceled:
		return 499 // the handler's own answer; a handler that gives up because its client went away releases the key (see run)

	// Released: the call was not processed, or may succeed if sent again.
	case codes.ResourceExhausted:
		return 429 // a quota or rate limit refused it: come back later, as 429 says over HTTP
	case codes.Aborted:
		// A concurrency conflict aborted it (a transaction abort, a
		// failed sequencer check): nothing was committed, and the client
		// is told to retry. google.rpc maps it to 409, but a 409 over
		// HTTP is a definite conflict with the resource (ALREADY_EXISTS
		// here) and is stored; a stored ABORTED would answer every retry
		// with the key with the same abort until the key expires.
		return 503
	case codes.Unavailable:
		return 503 // not processed: the server, or what it depends on, is unavailable
	case codes.DeadlineExceeded:
		return 504 // the call ran out of time; a handler that committed must answer its commit, as with a 5xx over HTTP
	case codes.Unimplemented:
		return 501 // nothing ran here; a retry that reaches a server implementing the method must run
	}
	return 500 // UNKNOWN, INTERNAL, DATA_LOSS, and any code gRPC may add: the server failed
}

// handle runs one unary call under its idempotency key.
func (k *keys) handle(ctx context.Context, req any, method string, handler grpc.UnaryHandler) (any, error) {
	if k.methods != nil && !k.methods[method] {
		return handler(ctx, req)
	}
	key, err := idempotency.ParseKey(metadata.ValueFromIncomingContext(ctx, MDIdempotencyKey), k.maxLen)
	switch {
	case errors.Is(err, idempotency.ErrNoKey):
		if !k.cfg.Required {
			return handler(idempotency.Unprotected(ctx), req)
		}
		return nil, status.Error(codes.InvalidArgument, "idempotency: this method requires an idempotency-key: a unique value per intended operation, sent again unchanged on every retry")
	case err != nil:
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// Attribute the call before fingerprinting it: a call that cannot be
	// costs nothing more.
	var scope string
	if k.cfg.Scope != nil {
		if scope, err = k.cfg.Scope(ctx); err == nil && scope == "" {
			err = errors.New("empty scope")
		}
		if err != nil {
			k.log.WarnContext(ctx, "idempotency: KeyConfig.Scope could not attribute the call to a caller; refusing it with PERMISSION_DENIED rather than looking its key up in a shared scope",
				"err", err, "method", method)
			return nil, status.Error(codes.PermissionDenied, "idempotency: this call could not be attributed to a caller, so its idempotency-key cannot be looked up; the call was not processed")
		}
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idempotency: request of %s is a %T, not a protocol buffer message; it cannot be fingerprinted", method, req)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idempotency: marshalling the request: %v", err)
	}
	res, sess, err := k.keys.Begin(ctx, idempotency.Request{
		Scope:       []string{scope, "grpc", method},
		Key:         key,
		Fingerprint: idempotency.Fingerprint(hashParts([]byte(method), body)),
		Operation:   method,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		if errors.Is(err, idempotency.ErrScopeFull) {
			// The store works: the caller is over its quota, which running
			// the call unprotected would bypass.
			d := res.RetryIn
			if d <= 0 {
				d = k.retry
			}
			k.pushback(ctx, d)
			return nil, status.Error(codes.ResourceExhausted, "idempotency: this caller holds as many idempotency keys as it may; retry after the pushback, or reuse a key")
		}
		if k.cfg.FailOpen {
			k.log.WarnContext(ctx, "idempotency: store failed; running the call without duplicate protection (FailOpen)", "err", err, "method", method, "op", "begin")
			return handler(idempotency.Unprotected(ctx), req)
		}
		k.log.ErrorContext(ctx, "idempotency: store failed; refusing the call with UNAVAILABLE rather than running it unprotected", "err", err, "method", method, "op", "begin")
		k.pushback(ctx, k.retry)
		chain.MarkNotProcessed(ctx) // the handler never runs
		return nil, status.Error(codes.Unavailable, "idempotency: the key store is unavailable; retry later")
	}
	switch res.State {
	case idempotency.StateInFlight:
		d := k.retry
		if res.RetryIn > 0 && res.RetryIn < d {
			d = res.RetryIn
		}
		k.pushback(ctx, d)
		return nil, status.Error(codes.Aborted, "idempotency: a call with the same idempotency-key is still being processed; retry after the pushback")
	case idempotency.StateMismatch:
		return nil, status.Error(codes.FailedPrecondition, "idempotency: this idempotency-key was used with a different request; a key must not be reused across different requests of a method")
	case idempotency.StateCompleted:
		return k.replay(ctx, method, res.Response)
	}
	return k.run(ctx, req, handler, sess)
}

func (k *keys) pushback(ctx context.Context, d time.Duration) {
	grpc.SetTrailer(ctx, metadata.Pairs(MDPushback, strconv.FormatInt((d+time.Millisecond-1).Milliseconds(), 10)))
}

// run runs the handler under the session, then hands its answer to the
// session, which stores it or releases the key by answerStatus; a panic
// ends the session with an unknown outcome (unless the handler called
// idempotency.Release) and goes on up.
func (k *keys) run(ctx context.Context, req any, handler grpc.UnaryHandler, sess *idempotency.Session) (reply any, err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		// A panic, or runtime.Goexit (v == nil). The handler may have
		// committed before it panicked: record the outcome as unknown,
		// unless it released the key, then let the panic go on up.
		v := recover()
		sess.Unknown(&idempotency.Response{Status: 500, Body: unknownStatus}, "panic")
		if v != nil {
			panic(v)
		}
	}()
	reply, err = handler(sess.Context(), req)
	returned = true

	if err == nil {
		m, ok := reply.(proto.Message)
		if !ok {
			sess.Release("reply is not a protocol buffer message")
			return reply, nil
		}
		body, merr := proto.Marshal(m)
		if merr != nil {
			sess.Release("marshalling the reply failed")
			return reply, nil
		}
		sess.Complete(&idempotency.Response{Status: 200, Body: body})
		return reply, nil
	}
	st := status.Convert(err)
	if st.Code() == codes.Canceled && ctx.Err() != nil {
		sess.Release("client gone") // the handler gave up because its client went away
		return nil, err
	}
	body, merr := proto.Marshal(st.Proto())
	if merr != nil {
		sess.Release("marshalling the status failed")
		return nil, err
	}
	sess.Complete(&idempotency.Response{Status: answerStatus(st.Code()), Body: body})
	return nil, err
}

// unknownStatus is the answer stored for a key whose handler panicked.
var unknownStatus = func() []byte {
	b, err := proto.Marshal(status.New(codes.Internal, "idempotency: outcome unknown for this idempotency-key: the first call with it ended in a server failure while it was being processed, so whether it took effect is unknown; it will not be run again with this key: find out whether the operation happened before trying it again with a new key").Proto())
	if err != nil {
		panic(err)
	}
	return b
}()

// replay answers with a stored answer.
func (k *keys) replay(ctx context.Context, method string, r *idempotency.Response) (any, error) {
	grpc.SetHeader(ctx, metadata.Pairs(idempotency.HeaderReplayed, "true"))
	if r.Status != 200 {
		var sp spb.Status
		if err := proto.Unmarshal(r.Body, &sp); err != nil {
			return nil, status.Errorf(codes.Internal, "idempotency: the stored answer does not decode: %v", err)
		}
		return nil, status.FromProto(&sp).Err()
	}
	m, err := k.newReply(method)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idempotency: %v", err)
	}
	if err := proto.Unmarshal(r.Body, m); err != nil {
		return nil, status.Errorf(codes.Internal, "idempotency: the stored answer does not decode: %v", err)
	}
	return m, nil
}

func (k *keys) newReply(method string) (proto.Message, error) {
	if k.cfg.NewReply != nil {
		return k.cfg.NewReply(method)
	}
	if mt, ok := k.replies.Load(method); ok {
		return mt.(protoreflect.MessageType).New().Interface(), nil
	}
	// "/pkg.Service/Method"
	i := strings.LastIndexByte(method, '/')
	if i <= 0 {
		return nil, fmt.Errorf("method name %q is not /service/method", method)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(method[1:i]))
	if err != nil {
		return nil, fmt.Errorf("service of %s is not registered: %v (set KeyConfig.NewReply)", method, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("%s is not a service", method[1:i])
	}
	md := sd.Methods().ByName(protoreflect.Name(method[i+1:]))
	if md == nil {
		return nil, fmt.Errorf("method %s is not registered (set KeyConfig.NewReply)", method)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil, fmt.Errorf("reply type of %s is not registered: %v (set KeyConfig.NewReply)", method, err)
	}
	k.replies.Store(method, mt)
	return mt.New().Interface(), nil
}
