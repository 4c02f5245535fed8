package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/internal/readlimit"
)

// Header names.
const (
	// HeaderKey is the request field carrying the idempotency key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed marks a replayed response: "Idempotent-Replayed: true".
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted marks a replayed response whose original body was
	// larger than Config.MaxResponseBytes and was not stored.
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
)

// Defaults used for zero Config fields; each field's comment gives its
// own.
const (
	defaultRetryAfter       = time.Second
	defaultMaxKeyLength     = 255
	defaultMaxBodyBytes     = 1 << 20
	defaultMaxResponseBytes = 1 << 20
)

// Config configures a Server; New copies it, so changing it afterwards has
// no effect. Every zero field means the default its comment gives, with one
// exception: New refuses a Config that says neither who is calling (Scope)
// nor that there is only one caller (SingleTenant), because a zero value
// there would put every caller's keys in one namespace, and a caller who
// learnt another's key would be replayed that caller's response. With
// SingleTenant set and nothing else, POST and PATCH with an Idempotency-Key
// are deduplicated for 24 hours and requests without one pass through. A
// Config is a plain value, safe to share while nobody modifies it.
type Config struct {
	// Name names the protected service in events (event.Event.Dependency),
	// so that the events of several Servers in one process can be told
	// apart. Empty leaves Dependency empty.
	Name string

	// Methods are the request methods the middleware handles; others pass
	// through untouched. Nil means POST and PATCH; an empty non-nil list,
	// or one with an empty or malformed method, is invalid. Methods are
	// matched without regard to case: net/http treats "post" as a method
	// of its own, but a router or handler behind the middleware may run it
	// as POST, so "post" and "Post" are handled, scoped and fingerprinted
	// as POST rather than let through unprotected.
	Methods []string

	// Required makes a key mandatory for Methods: a request without one
	// gets 400. False lets such requests through without protection.
	Required bool

	// Scope returns who is calling: a user, tenant or API key ID from the
	// authenticated request. Keys are scoped by it, so one caller can never
	// replay another's stored response, nor block or probe another's key.
	// It must not return an empty scope: an error, or an empty string,
	// means the request cannot be attributed to a caller (the middleware
	// runs before authentication, or the request is anonymous), and the
	// request is refused with 403 without running the handler, since
	// looking its key up in any shared scope could hand it someone else's
	// response; the error is logged, not sent. Return a fixed name such as
	// "anonymous" to let anonymous requests share one scope on purpose.
	// It is called before the body is read, and must not read it.
	// Exactly one of Scope and SingleTenant must be set.
	Scope func(*http.Request) (string, error)

	// MaxKeysPerScope caps the live keys, in flight and completed, that
	// one caller (one Scope) holds in the store, so that one caller
	// sending new keys can never fill the store for the others. A caller
	// at its quota gets 429 with Retry-After (the time until the first of
	// its keys expires) for a new key, without the handler running or the
	// key being locked, whatever FailOpen says; its retries of live keys
	// are still answered, and every other caller is unaffected. A released
	// key (a 5xx, say) no longer counts; a completed one counts until its
	// TTL ends, so size it to the keyed requests your busiest caller makes
	// in a TTL. Zero means 10,000 (about 7 a minute for 24 hours);
	// negative means no limit. It needs a store that implements
	// ScopedStore (memstore, redisstore and pgstore do); it does not apply
	// with SingleTenant, where there is no other caller to protect.
	MaxKeysPerScope int

	// SingleTenant puts every request in one key scope. Set it only when
	// every caller is trusted alike (one internal client, one service
	// account): any caller that learns a key can then be replayed the
	// response stored for it, and keys protect each other only by being
	// unguessable. Exactly one of Scope and SingleTenant must be set.
	SingleTenant bool

	// Route returns the operation a key is scoped to. Nil means the
	// ServeMux pattern that matched (r.Pattern, set when the middleware
	// wraps a handler registered on a ServeMux) or, when there is none,
	// the URL path. A pattern is the better scope: it is low-cardinality,
	// and reusing a key for another resource under the same route
	// ("/orders/1/pay" then "/orders/2/pay") is caught as a mismatch (422)
	// because the fingerprint covers the path.
	Route func(*http.Request) string

	// MaxKeyLength caps the key's length in bytes; longer keys get 400.
	// Zero means 255; a negative value is invalid.
	MaxKeyLength int

	// ValidateKey, if set, is called with each well-formed key and refuses
	// it (400, with the error's text) by returning an error: use it to
	// publish and enforce a key format such as UUIDs. Nil accepts any key
	// within MaxKeyLength.
	ValidateKey func(key string) error

	// MaxBodyBytes caps the request body read to fingerprint it; a larger
	// body gets 413 without running the handler (fingerprinting a prefix
	// would let two different payloads look the same). Zero means 1 MiB;
	// negative means no limit.
	MaxBodyBytes int64

	// MaxResponseBytes caps the response body stored for replay. A larger
	// response is still sent in full and the key is still completed (so a
	// retry cannot run the request twice), but its body is not stored: a
	// replay gets the status and stored headers, an empty body and
	// "Idempotent-Body-Omitted: true". Zero means 1 MiB; negative means no
	// limit.
	MaxResponseBytes int

	// TTL is how long a completed response, or an unknown outcome (see
	// Server.Middleware), is kept for replay. Zero means 24 hours; a
	// negative value is invalid.
	TTL time.Duration

	// Lease is how long a key stays locked without renewal, so a crashed
	// holder frees it: while the handler runs, the middleware renews the
	// lease every third of it (see DisableLeaseRenewal), and a process that
	// dies stops renewing. When the request's context has a deadline later
	// than Lease from now, the lease is that deadline plus one second
	// instead. Zero means 30 seconds; a negative value is invalid.
	Lease time.Duration

	// DisableLeaseRenewal turns off lease renewal. By default the
	// middleware extends the key's lease (Store.Extend) every third of the
	// lease while the handler runs, with a timer rather than a goroutine,
	// so a slow handler keeps its key however long it runs and a retry
	// gets 409 until it finishes. With renewal off the lease is fixed: a
	// handler that outlives it loses the key, a retry after the lease runs
	// the handler a second time, and the first one's response is not
	// stored. False (the zero value) means renewal is on.
	DisableLeaseRenewal bool

	// CancelOnLeaseLost cancels the handler's context as soon as its
	// key's lease is known lost, with an error matching ErrLeaseLost as
	// the cause (context.Cause): when a renewal or Confirm finds the lock
	// lost, or when the lease's end passes without a renewal (a store
	// outage outlasted it, or renewal is off and the handler outran it);
	// that is, as soon as Held would say so. Queries, store calls and
	// requests made with that context then stop, rather than finish work
	// that a retry may be doing again. A handler so cancelled that returns
	// without writing has its key released, not stored. It costs a
	// context and a timer per request run under a lease. False (the zero
	// value) leaves the handler's context alone; the handler can still ask
	// with Held and Confirm.
	CancelOnLeaseLost bool

	// StoreTimeout bounds each store call, lease renewals included. Zero
	// means 2 seconds; a negative value is invalid (a store call that may
	// hang forever would hold its request, and its key, as long).
	StoreTimeout time.Duration

	// StoredHeaders are the response header fields stored and replayed,
	// matched without regard to case. Only fields the handler set or
	// changed are stored, never those already in the response's header
	// when the middleware ran (set by middlewares outside it, such as
	// CORS, request IDs or rate-limit counters): a replay keeps their live
	// values. Nil means every such field except hop-by-hop fields,
	// Content-Length (recomputed), Date, and credentials, which a replay
	// would hand to whoever sends the key: Set-Cookie, Authorization,
	// Proxy-Authorization, Authentication-Info, and any field whose name
	// contains "auth", "token", "secret", "password", "session", "cookie",
	// "credential" or "api-key"/"apikey" (but WWW-Authenticate and
	// Proxy-Authenticate, the challenges a stored 401 or 407 must carry,
	// are kept). A field listed here is stored even if it is a credential.
	StoredHeaders []string

	// RetryAfter is the Retry-After sent with 503 when the store fails, and
	// the most sent with 409 while the key is in flight (less when the
	// holder's lease ends sooner). Zero means 1 second; a negative value
	// is invalid.
	RetryAfter time.Duration

	// FailOpen runs requests without protection when the store fails,
	// instead of refusing them with 503. A retry may then run twice: use
	// it only where a duplicate is cheaper than an outage. Such a request
	// is unprotected, as one without a key is: Held, Confirm and Release
	// return nil for it.
	FailOpen bool

	// DocsURL, if set, is the problem "type" of error responses and is
	// linked from them (Link: <DocsURL>; rel="describedby"), as the draft
	// asks. It must be an absolute URL. Empty means "about:blank".
	DocsURL string

	// Logger receives store failures, failed lease renewals and lost
	// leases. Nil means slog.Default().
	Logger *slog.Logger

	// Observer receives an event.Idempotency event per decision, with
	// Name as its Dependency. Nil means none.
	Observer event.Observer
}

// Server is the idempotency middleware: built by New, it makes Methods
// requests carrying an Idempotency-Key safe to retry. It is safe for
// concurrent use.
type Server struct {
	keys             *Keys
	cfg              Config
	methods          []string
	maxKeyLen        int
	maxBody          int64
	maxResp          int
	retryAfter       time.Duration
	keep             func(name string) bool
	log              *slog.Logger
	problemType      string
	retryAfterHeader string
}

// ErrInvalidConfig is the sentinel of every error New returns for a Config
// it rejects.
var ErrInvalidConfig = errors.New("idempotency: invalid config")

// configError is an invalid Config field: it names the field, what it held
// and what is allowed. It Is ErrInvalidConfig.
type configError struct{ msg string }

func (e *configError) Error() string        { return "idempotency: " + e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }

func invalid(format string, args ...any) error {
	return &configError{msg: fmt.Sprintf(format, args...)}
}

// New returns a Server that keeps its keys in store, configured by cfg. It
// returns an error that Is ErrInvalidConfig, naming every invalid field,
// when cfg is invalid: in particular when it sets neither Scope nor SingleTenant,
// since keys would then be shared by every caller and one caller could be
// replayed another's stored response. It returns an error if store is
// nil.
func New(store Store, cfg Config) (*Server, error) {
	if store == nil {
		return nil, errors.New("idempotency: New: nil Store")
	}
	if err := validate(&cfg); err != nil {
		return nil, err
	}
	s := &Server{
		keys: newKeys(store, KeysConfig{
			Name: cfg.Name, TTL: cfg.TTL, Lease: cfg.Lease, StoreTimeout: cfg.StoreTimeout,
			DisableLeaseRenewal: cfg.DisableLeaseRenewal, CancelOnLeaseLost: cfg.CancelOnLeaseLost,
			MaxKeysPerScope: cfg.MaxKeysPerScope, Logger: cfg.Logger, Observer: cfg.Observer,
		}),
		cfg:         cfg,
		methods:     cfg.Methods,
		maxKeyLen:   orDefault(cfg.MaxKeyLength, defaultMaxKeyLength),
		maxBody:     orDefault(cfg.MaxBodyBytes, defaultMaxBodyBytes),
		maxResp:     orDefault(cfg.MaxResponseBytes, defaultMaxResponseBytes),
		retryAfter:  orDefault(cfg.RetryAfter, defaultRetryAfter),
		log:         cfg.Logger,
		problemType: cfg.DocsURL,
	}
	if s.methods == nil {
		s.methods = []string{http.MethodPost, http.MethodPatch}
	} else {
		s.methods = make([]string, len(cfg.Methods))
		for i, m := range cfg.Methods {
			s.methods[i] = strings.ToUpper(m)
		}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.problemType == "" {
		s.problemType = "about:blank"
	}
	s.retryAfterHeader = retryAfterSeconds(s.retryAfter)
	if cfg.StoredHeaders == nil {
		s.keep = func(name string) bool { return !notStored[name] && !credential(name) }
	} else {
		keep := make(map[string]bool, len(cfg.StoredHeaders))
		for _, name := range cfg.StoredHeaders {
			if name = http.CanonicalHeaderKey(name); name != "Content-Length" {
				keep[name] = true
			}
		}
		s.keep = func(name string) bool { return keep[name] }
	}
	return s, nil
}

// validate reports every invalid field of cfg.
func validate(cfg *Config) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, invalid("Config."+format, args...)) }
	switch {
	case cfg.Scope == nil && !cfg.SingleTenant:
		bad("Scope is nil and SingleTenant is false; want exactly one of them: " +
			"without a scope every caller's keys would share one namespace, and a caller who learnt another's key " +
			"would be replayed that caller's stored response (set Scope to return the authenticated caller, or " +
			"SingleTenant when every caller is trusted alike)")
	case cfg.Scope != nil && cfg.SingleTenant:
		bad("Scope is set and SingleTenant is true; want exactly one of them: SingleTenant puts every " +
			"caller in one scope, which contradicts scoping keys by caller")
	}
	if cfg.Methods != nil && len(cfg.Methods) == 0 {
		bad("Methods is empty; want nil (POST and PATCH) or at least one method")
	}
	for i, m := range cfg.Methods {
		if !validToken(m) {
			bad("Methods[%d] is %q; want an HTTP method token such as %q", i, m, http.MethodPost)
		}
	}
	if cfg.MaxKeyLength < 0 {
		bad("MaxKeyLength is %d; want a positive length in bytes, or 0 for %d", cfg.MaxKeyLength, defaultMaxKeyLength)
	}
	errs = append(errs, checkDurations("Config.", cfg.TTL, cfg.Lease, cfg.StoreTimeout)...)
	if cfg.RetryAfter < 0 {
		bad("RetryAfter is %v; want a positive duration, or 0 for %v", cfg.RetryAfter, defaultRetryAfter)
	}
	if cfg.DocsURL != "" {
		if u, err := url.Parse(cfg.DocsURL); err != nil || !u.IsAbs() {
			bad("DocsURL is %q; want an absolute URL, or empty for about:blank", cfg.DocsURL)
		}
	}
	return errors.Join(errs...)
}

// validToken reports whether s is an RFC 9110 token, as a method is.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// Middleware returns next wrapped so that Methods requests carrying an
// Idempotency-Key (draft-ietf-httpapi-idempotency-key-header) are safe to
// retry: the handler runs once per key, and retries get the stored
// response. Its method value is the func(http.Handler) http.Handler that
// routers take.
//
// For each request with a key, scoped by Scope, method and Route:
//
//   - first time: the key is locked in the store with a lease, the handler
//     runs, and its response (status, StoredHeaders, body) is stored for
//     TTL;
//   - the same key and payload again: the stored response is replayed byte
//     for byte with "Idempotent-Replayed: true"; the handler does not run;
//   - the same key while the first request is still running: 409 with
//     Retry-After;
//   - the same key with another payload (method, path, query, body): 422;
//   - a malformed key, or none when Required: 400; a body over
//     MaxBodyBytes: 413; a request Scope cannot attribute: 403; a new key
//     from a caller holding MaxKeysPerScope keys: 429.
//
// A response that says the request was not processed, or may succeed
// later (408, 425, 429 and every 5xx), and a handler that returns without
// writing after its client went away, release the key instead of storing,
// so a later retry runs the handler again; every other response (2xx, 3xx,
// the other 4xx) is stored. The rule is the one every transport shares:
// see Keys.
//
// A panic and a hijacked connection leave the outcome unknown: the handler
// may have committed its side effect before it panicked (or before the
// connection was taken over and cut), and nothing says whether it did. So
// the key is not released, which would run the handler a second time for
// the retry; it is completed with an unknown outcome, and for TTL every
// retry with that key gets, without the handler running, a replayed 500
// problem document (application/problem+json, "Idempotent-Replayed: true")
// saying that the outcome of the first request is unknown. 500 because the
// server failed while processing the request and a retry cannot change
// that; it is distinguishable from a live failure by
// "Idempotent-Replayed: true", since a 5xx the handler writes is never
// stored. The caller has to find out what happened (look the resource up)
// before trying again with a new key. A handler that knows it committed
// nothing can call Release first: the key is then released, however the
// handler ends, and a retry runs it again. A hijacked key is settled as
// the connection is taken over, before the handler can close it (Hijack
// returns after that store call), so that a client retrying at once finds
// the outcome recorded. A panic is re-raised once the key is recorded, so
// net/http (or a recovering middleware outside this one) sees it as
// before.
//
// When the store fails the request is refused with 503 and Retry-After (or
// run unprotected with FailOpen), and logged.
//
// While the handler runs, its key's lease is renewed every third of it, so
// a slow handler keeps its key and a process that dies frees it within a
// lease. Should renewals fail until the lease ends (a long store outage),
// the handler still finishes and its client gets its response, but a retry
// may then run the handler again and the first response is not stored;
// both are logged. A handler about to commit a side effect that must not
// happen twice can make sure it still holds its key: Held tells it without
// I/O, and Confirm extends the lease with one store call. For a request
// that is unprotected by choice (no key, Required false; or run by
// FailOpen) both return nil, so a handler needs no special case for it.
func (s *Server) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.serve(w, r, next)
	})
}

// notStored are the fields never stored by default.
var notStored = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Transfer-Encoding": true, "Te": true, "Trailer": true, "Upgrade": true,
	"Content-Length": true, "Date": true, "Set-Cookie": true,
	HeaderReplayed: true, HeaderBodyOmitted: true,
}

// credentialWords are the parts of a field name that make it a
// credential, lower-case.
var credentialWords = [...]string{"auth", "token", "secret", "password", "session", "cookie", "credential", "api-key", "apikey"}

// credential reports whether the field named name (canonical) may carry a
// credential: replayed, it would be handed to whoever sends the key. The
// challenges a 401 or 407 must carry are not credentials.
func credential(name string) bool {
	if name == "Www-Authenticate" || name == "Proxy-Authenticate" {
		return false
	}
	for _, w := range credentialWords {
		if containsFold(name, w) {
			return true
		}
	}
	return false
}

// containsFold reports whether s contains lower, which is lower-case
// ASCII, without regard to case; it allocates nothing.
func containsFold(s, lower string) bool {
	for i := 0; i+len(lower) <= len(s); i++ {
		j := 0
		for ; j < len(lower); j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != lower[j] {
				break
			}
		}
		if j == len(lower) {
			return true
		}
	}
	return false
}

// orDefault returns def for zero, v otherwise. New has refused the
// negative values that mean nothing; those left mean no limit.
func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// method returns r's method as the middleware handles it, upper-case,
// and whether it is one of m.methods.
func (m *Server) method(r *http.Request) (string, bool) {
	if slices.Contains(m.methods, r.Method) { // the usual case: no allocation
		return r.Method, true
	}
	for _, want := range m.methods {
		if strings.EqualFold(r.Method, want) {
			return want, true
		}
	}
	return r.Method, false
}

func (m *Server) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	method, ok := m.method(r)
	if !ok {
		next.ServeHTTP(w, r)
		return
	}
	key, err := ParseKey(r.Header.Values(HeaderKey), m.maxKeyLen)
	switch {
	case errors.Is(err, ErrNoKey):
		if !m.cfg.Required {
			next.ServeHTTP(w, r.WithContext(Unprotected(r.Context())))
			return
		}
		m.problem(w, http.StatusBadRequest, "Idempotency-Key is missing",
			"This operation requires an Idempotency-Key header: a unique value (for example a UUID) per intended operation, sent again unchanged on every retry.")
		return
	case err == nil && m.cfg.ValidateKey != nil:
		if verr := m.cfg.ValidateKey(key); verr != nil {
			err = fmt.Errorf("%w: %w", ErrInvalidKey, verr)
		}
	}
	if err != nil {
		m.problem(w, http.StatusBadRequest, "Idempotency-Key is invalid", err.Error())
		return
	}

	// Attribute the request before reading its body: a request that
	// cannot be costs nothing more.
	var scope string
	if m.cfg.Scope != nil {
		if scope, err = m.cfg.Scope(r); err == nil && scope == "" {
			err = errors.New("empty scope")
		}
		if err != nil {
			m.log.WarnContext(r.Context(), "idempotency: Config.Scope could not attribute the request to a caller; refusing it with 403 rather than looking its key up in a shared scope",
				"err", err, "method", method, "route", m.route(r))
			m.problem(w, http.StatusForbidden, "Caller unknown for Idempotency-Key",
				"This request could not be attributed to a caller, so its Idempotency-Key cannot be looked up; the request was not processed.")
			return
		}
	}
	body, status, err := m.readBody(r)
	if err != nil {
		m.problem(w, status, http.StatusText(status), err.Error())
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	fp := fingerprint(method, r, body)

	ctx := r.Context()
	route := m.route(r)
	res, sess, err := m.keys.begin(ctx, operation(r), func() []slog.Attr { return []slog.Attr{slog.String("method", method), slog.String("route", route)} },
		[]string{scope, method, route}, key, fp)
	if err != nil {
		if ctx.Err() != nil {
			return // the client is gone; nothing to answer, nothing ran
		}
		if errors.Is(err, ErrScopeFull) {
			// The caller's own quota, not a store failure: FailOpen does
			// not apply, and nothing is logged per request.
			ra := m.retryAfterHeader
			if res.RetryIn > 0 {
				ra = retryAfterSeconds(res.RetryIn)
			}
			w.Header().Set("Retry-After", ra)
			m.problem(w, http.StatusTooManyRequests, "Too many Idempotency-Keys in use",
				"This caller holds as many live Idempotency-Keys as it may; the request was not processed. Retry it after the delay in Retry-After, when one of them expires.")
			return
		}
		m.storeFailed(w, r, next, route, "begin", err)
		return
	}

	switch res.State {
	case StateAcquired:
		m.run(w, r, next, route, sess)
	case StateInFlight:
		ra := m.retryAfterHeader
		if res.RetryIn > 0 && res.RetryIn < m.retryAfter {
			ra = retryAfterSeconds(res.RetryIn)
		}
		w.Header().Set("Retry-After", ra)
		m.problem(w, http.StatusConflict, "A request is outstanding for this Idempotency-Key",
			"A request with the same Idempotency-Key for the same operation is still being processed; retry after the delay in Retry-After.")
	case StateCompleted:
		replay(w, res.Response)
	case StateMismatch:
		m.problem(w, http.StatusUnprocessableEntity, "Idempotency-Key is already used",
			"This Idempotency-Key was used with a different request payload; an Idempotency-Key must not be reused across different payloads of this operation.")
	}
}

// readBody reads the whole request body, up to maxBody.
func (m *Server) readBody(r *http.Request) ([]byte, int, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0, nil
	}
	if m.maxBody >= 0 && r.ContentLength > m.maxBody {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("idempotency: request body of %d bytes is over the limit of %d", r.ContentLength, m.maxBody)
	}
	// Memory follows the bytes read, and a limit of math.MaxInt64 does not
	// wrap to "read nothing".
	body, over, err := readlimit.ReadAtMost(r.Body, m.maxBody)
	r.Body.Close()
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("idempotency: reading the request body: %w", err)
	}
	if over {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("idempotency: request body is over the limit of %d bytes", m.maxBody)
	}
	return body, 0, nil
}

// fingerprint hashes what makes two requests with one key the same request:
// method, escaped path, query and body, each length-prefixed.
func fingerprint(method string, r *http.Request, body []byte) Fingerprint {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, s := range [...]string{method, r.URL.EscapedPath(), r.URL.RawQuery} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(body)))])
	h.Write(body)
	var fp Fingerprint
	h.Sum(fp[:0])
	return fp
}

func (m *Server) route(r *http.Request) string {
	switch {
	case m.cfg.Route != nil:
		return m.cfg.Route(r)
	case r.Pattern != "":
		return r.Pattern
	}
	return r.URL.Path
}

// run runs the handler under the session's lock, then stores the response
// or releases the key: the answer's status decides (Session.Complete).
func (m *Server) run(w http.ResponseWriter, r *http.Request, next http.Handler, route string, sess *Session) {
	hr := r.WithContext(sess.Context())
	// The recorder settles the key when the connection is taken over,
	// before the handler gets it: once the handler can close it, the
	// client may retry at once, and the retry must find the outcome
	// recorded, not the key in flight.
	rec := &recorder{w: w, max: m.maxResp, keep: m.keep, outer: outerHeader(w.Header()), hj: hijackKey{m: m, sess: sess}}
	returned := false
	defer func() {
		if returned {
			return
		}
		// A panic, or runtime.Goexit (v == nil). The handler may have
		// committed before it panicked: record the outcome as unknown,
		// unless it released the key, then let the panic go on up.
		v := recover()
		if !rec.hijacked {
			sess.Unknown(m.unknownResponse(), "panic")
		}
		sess.stop(true)
		if v != nil {
			panic(v)
		}
	}()
	next.ServeHTTP(rec, hr)
	returned = true
	// A handler that wrote nothing once its context was done gave up: its
	// client went away, or (CancelOnLeaseLost) its lease was lost. Ask
	// before the session ends, which cancels that context.
	gaveUp := rec.status == 0 && hr.Context().Err() != nil

	switch {
	case rec.hijacked:
		sess.stop(true) // settled when the connection was taken over
		return
	case gaveUp && r.Context().Err() != nil:
		sess.Release("client gone, nothing written")
		return
	case gaveUp:
		sess.Release("lease lost, nothing written")
		return
	}
	resp := &Response{Status: rec.status, Header: rec.header, BodyOmitted: rec.omitted}
	if resp.Status == 0 { // nothing written: net/http sends 200 and the header as it is now
		resp.Status = http.StatusOK
		resp.Header = storedHeader(w.Header(), m.keep, rec.outer)
	}
	if !rec.omitted && rec.body.Len() > 0 {
		resp.Body = rec.body.Bytes()
	}
	if rec.omitted && !releases(resp.Status) {
		m.log.WarnContext(r.Context(), "idempotency: response body over MaxResponseBytes; storing the response without its body",
			"method", r.Method, "route", route, "limit", m.maxResp)
	}
	sess.Complete(resp)
}

// unknownResponse is the response stored for a key whose outcome is
// unknown.
func (m *Server) unknownResponse() *Response {
	h, body := m.problemDoc(http.StatusInternalServerError, "Outcome unknown for this Idempotency-Key",
		"The first request with this Idempotency-Key ended without a response (the server failed while processing it), so whether it took effect is unknown. "+
			"It will not be run again with this key: find out whether the operation happened before trying it again with a new key.")
	return &Response{Status: http.StatusInternalServerError, Header: h, Body: body}
}

func (m *Server) storeFailed(w http.ResponseWriter, r *http.Request, next http.Handler, route, op string, err error) {
	if m.cfg.FailOpen {
		m.log.WarnContext(r.Context(), "idempotency: store failed; running the request without duplicate protection (FailOpen)",
			"op", op, "err", err, "method", r.Method, "route", route)
		next.ServeHTTP(w, r.WithContext(Unprotected(r.Context())))
		return
	}
	m.log.ErrorContext(r.Context(), "idempotency: store failed; refusing the request with 503 rather than running it unprotected",
		"op", op, "err", err, "method", r.Method, "route", route)
	chain.MarkNotProcessed(r.Context()) // next never runs
	w.Header().Set("Retry-After", m.retryAfterHeader)
	m.problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable",
		"The request was not processed; retry it with the same Idempotency-Key after the delay in Retry-After.")
}

// outerHeader copies the fields already in h when the middleware runs,
// set by middlewares outside it; nil if none.
func outerHeader(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	return h.Clone()
}

// storedHeader copies the fields of h that keep selects (by canonical
// name, so that a field set under a non-canonical name is matched too)
// and that the handler set: not in outer, or changed since; nil if none.
func storedHeader(h http.Header, keep func(string) bool, outer http.Header) http.Header {
	var out http.Header
	for k, vs := range h {
		if len(vs) == 0 || !keep(http.CanonicalHeaderKey(k)) {
			continue
		}
		if was, ok := outer[k]; ok && slices.Equal(was, vs) {
			continue // an outer middleware's, as it set it
		}
		if out == nil {
			out = make(http.Header, len(h))
		}
		out[k] = slices.Clone(vs)
	}
	return out
}

// replay writes a stored response.
func replay(w http.ResponseWriter, resp *Response) {
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = slices.Clone(vs)
	}
	h.Set(HeaderReplayed, "true")
	if resp.BodyOmitted {
		h.Set(HeaderBodyOmitted, "true")
	}
	if bodyAllowed(resp.Status) {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 && bodyAllowed(resp.Status) {
		w.Write(resp.Body)
	}
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// operation is the Operation of r's events.
func operation(r *http.Request) string {
	if op := event.Operation(r.Context()); op != "" {
		return op
	}
	return r.Pattern // low-cardinality; a raw path never goes here
}

type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// problem writes an RFC 9457 problem document.
func (m *Server) problem(w http.ResponseWriter, status int, title, detail string) {
	ph, b := m.problemDoc(status, title, detail)
	h := w.Header()
	for k, v := range ph {
		h[k] = v
	}
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// problemDoc returns the header fields and body of an RFC 9457 problem
// document.
func (m *Server) problemDoc(status int, title, detail string) (http.Header, []byte) {
	h := http.Header{
		"Content-Type":  {"application/problem+json"},
		"Cache-Control": {"no-store"},
	}
	if m.cfg.DocsURL != "" {
		h.Set("Link", "<"+m.cfg.DocsURL+`>; rel="describedby"`)
	}
	b, _ := json.Marshal(problemBody{Type: m.problemType, Title: title, Status: status, Detail: detail})
	return h, append(b, '\n')
}

// retryAfterSeconds formats d as delay-seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64(d / time.Second) // no d + time.Second - 1: it could overflow
	if d%time.Second != 0 {
		s++
	}
	return strconv.FormatInt(max(s, 1), 10)
}
