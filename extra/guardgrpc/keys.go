package guardgrpc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
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

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/idempotency"
)

// MDReplayed is the response header of a replayed call:
// "idempotent-replayed: true".
const MDReplayed = "idempotent-replayed"

// KeyConfig configures idempotency keys on unary calls: the gRPC form of
// the idempotency package's HTTP middleware, on the same Store and with
// the same semantics. A call carrying an idempotency-key runs its handler
// once per key; a retry with the same key and request gets the stored
// answer (with the header idempotent-replayed: true); the same key while
// the first call runs gets ABORTED with a pushback; the same key with
// another request gets FAILED_PRECONDITION; a malformed key gets
// INVALID_ARGUMENT; a call that Scope cannot attribute to a caller gets
// PERMISSION_DENIED; a store failure gets UNAVAILABLE with a pushback (or
// runs unprotected with FailOpen).
//
// What is stored: a success (the marshalled response message) and an
// error the caller caused (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS,
// PERMISSION_DENIED, UNAUTHENTICATED, FAILED_PRECONDITION, OUT_OF_RANGE,
// UNIMPLEMENTED, CANCELLED by the handler, ABORTED), status details
// included. Any other error, the server's (UNAVAILABLE, INTERNAL, UNKNOWN,
// DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, DATA_LOSS), and a handler that
// fails after its client went away release the key, so a retry runs the
// handler again, as a 5xx does over HTTP.
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
// calls ReleaseKey first: its key is then released however it ends.
//
// A KeyConfig is a plain value that NewServer reads once, safe to share;
// its Store, Scope and NewReply must be safe for concurrent use. NewServer
// refuses a KeyConfig that sets neither Scope nor SingleTenant.
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

	// MaxKeyLength caps the key's length in bytes. Zero means
	// idempotency.DefaultMaxKeyLength (255); negative is invalid.
	MaxKeyLength int

	// TTL is how long an answer, or an unknown outcome (a panic), is kept
	// for replay. Zero means
	// idempotency.DefaultTTL (24 h); negative is invalid.
	TTL time.Duration

	// Lease is how long a key stays locked without renewal; while the
	// handler runs it is renewed every third of it. A call whose deadline
	// is later than Lease from now gets that deadline plus one second.
	// Zero means idempotency.DefaultLease (30 s); negative is invalid.
	Lease time.Duration

	// StoreTimeout bounds each store call. Zero means
	// idempotency.DefaultStoreTimeout (2 s); negative is invalid.
	StoreTimeout time.Duration

	// RetryAfter is the pushback sent when the store fails, and the most
	// sent while the key is in flight. Zero means
	// idempotency.DefaultRetryAfter (1 s); negative is invalid.
	RetryAfter time.Duration

	// FailOpen runs calls unprotected when the store fails, instead of
	// refusing them. A retry may then run twice.
	FailOpen bool

	// Logger receives store failures. Nil means slog.Default().
	Logger *slog.Logger
}

type keys struct {
	cfg     KeyConfig
	obs     event.Observer
	methods map[string]bool // nil: all
	maxLen  int
	ttl     time.Duration
	lease   time.Duration
	timeout time.Duration
	retry   time.Duration
	log     *slog.Logger
	replies sync.Map // method -> protoreflect.MessageType
}

func newKeys(cfg KeyConfig, obs event.Observer) (*keys, error) {
	if cfg.Store == nil {
		return nil, invalid("KeyConfig.Store is nil; want an idempotency.Store")
	}
	switch {
	case cfg.Scope == nil && !cfg.SingleTenant:
		return nil, invalid("KeyConfig.Scope is nil and KeyConfig.SingleTenant is false; want exactly one of them: " +
			"without a scope every caller's keys would share one namespace, and a caller who learnt another's key " +
			"would be replayed that caller's stored answer (set Scope to return the authenticated caller, or " +
			"SingleTenant when every caller is trusted alike)")
	case cfg.Scope != nil && cfg.SingleTenant:
		return nil, invalid("KeyConfig.Scope is set and KeyConfig.SingleTenant is true; want exactly one of them: " +
			"SingleTenant puts every caller in one scope, which contradicts scoping keys by caller")
	}
	k := &keys{cfg: cfg, obs: obs, log: cfg.Logger}
	var err error
	pick := func(name string, v, def time.Duration) time.Duration {
		switch {
		case v < 0 && err == nil:
			err = invalid("KeyConfig.%s is %v; want 0 (the default) or more", name, v)
		case v <= 0:
			return def
		}
		return v
	}
	k.ttl = pick("TTL", cfg.TTL, idempotency.DefaultTTL)
	k.lease = pick("Lease", cfg.Lease, idempotency.DefaultLease)
	k.timeout = pick("StoreTimeout", cfg.StoreTimeout, idempotency.DefaultStoreTimeout)
	k.retry = pick("RetryAfter", cfg.RetryAfter, idempotency.DefaultRetryAfter)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.MaxKeyLength < 0:
		return nil, invalid("KeyConfig.MaxKeyLength is %d; want 0 (the default) or more", cfg.MaxKeyLength)
	case cfg.MaxKeyLength == 0:
		k.maxLen = idempotency.DefaultMaxKeyLength
	default:
		k.maxLen = cfg.MaxKeyLength
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

// ParseKey returns the idempotency key carried by the values of an
// idempotency-key metadata entry, by the rules of the HTTP middleware: one
// value, either an RFC 8941 string ("...") or a bare value of visible
// ASCII without DQUOTE, comma, semicolon or backslash, at most maxLen
// bytes. It fails with an error that Is idempotency.ErrNoKey or
// idempotency.ErrInvalidKey.
func ParseKey(values []string, maxLen int) (string, error) {
	switch len(values) {
	case 0:
		return "", idempotency.ErrNoKey
	case 1:
	default:
		return "", fmt.Errorf("%w: %d values, want one", idempotency.ErrInvalidKey, len(values))
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", idempotency.ErrInvalidKey)
	}
	if len(v) > 2*maxLen+2 {
		return "", fmt.Errorf("%w: longer than %d characters", idempotency.ErrInvalidKey, maxLen)
	}
	key := v
	if v[0] == '"' {
		var b strings.Builder
		closed := false
		for i := 1; i < len(v); i++ {
			c := v[i]
			switch {
			case c == '\\':
				i++
				if i == len(v) || (v[i] != '"' && v[i] != '\\') {
					return "", fmt.Errorf("%w: bad escape at %d", idempotency.ErrInvalidKey, i)
				}
				b.WriteByte(v[i])
			case c == '"':
				if i != len(v)-1 {
					return "", fmt.Errorf("%w: unexpected %q after the key", idempotency.ErrInvalidKey, v[i+1:])
				}
				closed = true
			case c < 0x20 || c > 0x7e:
				return "", fmt.Errorf("%w: character %q at %d", idempotency.ErrInvalidKey, c, i)
			default:
				b.WriteByte(c)
			}
		}
		if !closed {
			return "", fmt.Errorf("%w: missing closing quote", idempotency.ErrInvalidKey)
		}
		key = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c < 0x21 || c > 0x7e || c == '"' || c == ',' || c == ';' || c == '\\' {
				return "", fmt.Errorf("%w: character %q at %d", idempotency.ErrInvalidKey, c, i)
			}
		}
	}
	if key == "" {
		return "", fmt.Errorf("%w: empty", idempotency.ErrInvalidKey)
	}
	if len(key) > maxLen {
		return "", fmt.Errorf("%w: longer than %d characters", idempotency.ErrInvalidKey, maxLen)
	}
	return key, nil
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

// stored reports whether an error answer is the caller's doing, and so is
// stored and replayed, rather than the server's, which releases the key.
func stored(c codes.Code) bool {
	switch c {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.Unauthenticated, codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented,
		codes.Canceled, codes.Aborted:
		return true
	}
	return false
}

// httpStatus is the status a stored gRPC answer is recorded under in the
// Store (which speaks HTTP): 200 for a success, else the code's HTTP
// mapping. The gRPC status itself is in the body.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return 200
	case codes.NotFound, codes.Unimplemented:
		return 404
	case codes.AlreadyExists, codes.Aborted:
		return 409
	case codes.PermissionDenied:
		return 403
	case codes.Unauthenticated:
		return 401
	case codes.Canceled:
		return 499
	}
	return 400
}

func (k *keys) emit(ctx context.Context, method, reason string, err error) {
	if k.obs == nil {
		return
	}
	k.obs.Observe(ctx, event.Event{Kind: event.Idempotency, Operation: method, Reason: reason, Err: err})
}

func (k *keys) pushback(ctx context.Context, d time.Duration) {
	grpc.SetTrailer(ctx, metadata.Pairs(MDPushback, strconv.FormatInt((d+time.Millisecond-1).Milliseconds(), 10)))
}

// handle runs one unary call under its idempotency key.
func (k *keys) handle(ctx context.Context, req any, method string, handler grpc.UnaryHandler) (any, error) {
	if k.methods != nil && !k.methods[method] {
		return handler(ctx, req)
	}
	key, err := ParseKey(metadata.ValueFromIncomingContext(ctx, MDIdempotencyKey), k.maxLen)
	switch {
	case errors.Is(err, idempotency.ErrNoKey):
		if !k.cfg.Required {
			return handler(unprotectedCall(ctx), req)
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
	fp := idempotency.Fingerprint(hashParts([]byte(method), body))
	sum := hashParts([]byte(scope), []byte("grpc"), []byte(method), []byte(key))
	skey := hex.EncodeToString(sum[:])

	lease := k.lease
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl) + time.Second; d > lease {
			lease = d
		}
	}
	bctx, cancel := context.WithTimeout(ctx, k.timeout)
	res, err := k.cfg.Store.Begin(bctx, skey, fp, lease)
	cancel()
	if err == nil && (res.State < idempotency.StateAcquired || res.State > idempotency.StateMismatch ||
		res.State == idempotency.StateCompleted && (res.Response == nil || res.Response.Status < 100 || res.Response.Status > 999)) {
		err = fmt.Errorf("idempotency: store returned invalid result %v", res.State)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		k.emit(ctx, method, event.ReasonStoreError, err)
		k.log.ErrorContext(ctx, "idempotency: store failed", "err", err, "method", method, "op", "begin")
		if k.cfg.FailOpen {
			return handler(unprotectedCall(ctx), req)
		}
		k.pushback(ctx, k.retry)
		return nil, status.Error(codes.Unavailable, "idempotency: the key store is unavailable; retry later")
	}
	switch res.State {
	case idempotency.StateInFlight:
		k.emit(ctx, method, event.ReasonConflict, nil)
		d := k.retry
		if res.RetryIn > 0 && res.RetryIn < d {
			d = res.RetryIn
		}
		k.pushback(ctx, d)
		return nil, status.Error(codes.Aborted, "idempotency: a call with the same idempotency-key is still being processed; retry after the pushback")
	case idempotency.StateMismatch:
		k.emit(ctx, method, event.ReasonMismatch, nil)
		return nil, status.Error(codes.FailedPrecondition, "idempotency: this idempotency-key was used with a different request; a key must not be reused across different requests of a method")
	case idempotency.StateCompleted:
		k.emit(ctx, method, event.ReasonReplayed, nil)
		return k.replay(ctx, method, res.Response)
	}
	return k.run(ctx, req, method, handler, skey, res.Token, lease)
}

// run runs the handler holding the key, renews the lease while it runs,
// then stores the answer or releases the key; a panic completes the key
// with an unknown outcome (unless the handler called ReleaseKey) and goes
// on up.
func (k *keys) run(ctx context.Context, req any, method string, handler grpc.UnaryHandler, skey, token string, lease time.Duration) (reply any, err error) {
	stop := k.renew(ctx, skey, token, lease)
	kr := &keyRun{}
	returned := false
	defer func() {
		if returned {
			return
		}
		// A panic, or runtime.Goexit (v == nil). The handler may have
		// committed before it panicked: record the outcome as unknown,
		// unless it released the key, then let the panic go on up.
		v := recover()
		stop()
		if kr.finish() {
			k.release(ctx, method, skey, token, "panic after ReleaseKey")
		} else {
			k.unknown(ctx, method, skey, token)
		}
		if v != nil {
			panic(v)
		}
	}()
	reply, err = handler(context.WithValue(ctx, keyRunKey{}, kr), req)
	returned = true
	stop()
	if kr.finish() {
		k.release(ctx, method, skey, token, "released by the handler")
		return reply, err
	}

	var resp *idempotency.Response
	if err == nil {
		m, ok := reply.(proto.Message)
		if !ok {
			k.release(ctx, method, skey, token, "reply is not a protocol buffer message")
			return reply, nil
		}
		body, merr := proto.Marshal(m)
		if merr != nil {
			k.release(ctx, method, skey, token, "marshalling the reply failed")
			return reply, nil
		}
		resp = &idempotency.Response{Status: 200, Body: body}
	} else {
		st := status.Convert(err)
		if !stored(st.Code()) || (st.Code() == codes.Canceled && ctx.Err() != nil) {
			k.release(ctx, method, skey, token, "code "+st.Code().String())
			return nil, err
		}
		body, merr := proto.Marshal(st.Proto())
		if merr != nil {
			k.release(ctx, method, skey, token, "marshalling the status failed")
			return nil, err
		}
		resp = &idempotency.Response{Status: httpStatus(st.Code()), Body: body}
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.timeout)
	defer cancel()
	if cerr := k.cfg.Store.Complete(dctx, skey, token, resp, k.ttl); cerr != nil {
		k.emit(ctx, method, event.ReasonStoreError, cerr)
		k.log.ErrorContext(ctx, "idempotency: storing the answer failed; a retry may run the call again", "err", cerr, "method", method)
		return reply, err
	}
	k.emit(ctx, method, event.ReasonStored, nil)
	return reply, err
}

// renew extends the lease every third of it while the handler runs, on a
// timer rather than a goroutine. The returned stop waits for a renewal in
// progress.
func (k *keys) renew(ctx context.Context, skey, token string, lease time.Duration) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	every := max(lease/3, time.Millisecond)
	mu.Lock() // the callback reads t: it must see it set
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.timeout)
		err := k.cfg.Store.Extend(ectx, skey, token, lease)
		cancel()
		if err != nil {
			k.log.WarnContext(ctx, "idempotency: renewing the key's lease failed", "err", err)
			if errors.Is(err, idempotency.ErrLockLost) {
				return
			}
		}
		t.Reset(every)
	})
	return func() {
		t.Stop()
		mu.Lock()
		stopped = true
		mu.Unlock()
	}
}

func (k *keys) release(ctx context.Context, method, skey, token, why string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.timeout)
	defer cancel()
	if err := k.cfg.Store.Release(dctx, skey, token); err != nil {
		k.emit(ctx, method, event.ReasonStoreError, err)
		k.log.WarnContext(ctx, "idempotency: releasing the key failed", "err", err, "method", method, "why", why)
		return
	}
	k.emit(ctx, method, event.ReasonReleased, nil)
}

// unknownStatus is the answer stored for a key whose handler panicked.
var unknownStatus = func() []byte {
	b, err := proto.Marshal(status.New(codes.Internal, "idempotency: outcome unknown for this idempotency-key: the first call with it ended in a server failure while it was being processed, so whether it took effect is unknown; it will not be run again with this key: find out whether the operation happened before trying it again with a new key").Proto())
	if err != nil {
		panic(err)
	}
	return b
}()

// unknown completes the key with the unknown-outcome answer, so that
// retries are told so rather than run the handler again.
func (k *keys) unknown(ctx context.Context, method, skey, token string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.timeout)
	defer cancel()
	k.emit(ctx, method, event.ReasonOutcomeUnknown, nil)
	if err := k.cfg.Store.Complete(dctx, skey, token, &idempotency.Response{Status: 500, Body: unknownStatus}, k.ttl); err != nil {
		if !errors.Is(err, idempotency.ErrLockLost) {
			k.emit(ctx, method, event.ReasonStoreError, err)
		}
		k.log.ErrorContext(ctx, "idempotency: the handler's outcome is unknown and recording that failed; a retry may run the call again",
			"err", err, "method", method)
		return
	}
	k.log.WarnContext(ctx, "idempotency: the handler's outcome is unknown; retries with its key get INTERNAL until the key expires, without running the handler",
		"method", method, "ttl", k.ttl)
}

// replay answers with a stored answer.
func (k *keys) replay(ctx context.Context, method string, r *idempotency.Response) (any, error) {
	grpc.SetHeader(ctx, metadata.Pairs(MDReplayed, "true"))
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
