package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/guardrail-go/guardrail/event"
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

// Defaults used for zero Config fields.
const (
	DefaultTTL              = 24 * time.Hour
	DefaultLease            = 30 * time.Second
	DefaultStoreTimeout     = 2 * time.Second
	DefaultRetryAfter       = time.Second
	DefaultMaxKeyLength     = 255
	DefaultMaxBodyBytes     = 1 << 20
	DefaultMaxResponseBytes = 1 << 20
)

// Config configures Middleware, which reads it once; changing it afterwards
// has no effect. The zero value is valid: POST and PATCH with
// an Idempotency-Key are deduplicated for 24 hours, requests without one pass
// through, and every caller shares one key scope (set Principal when there is
// more than one caller).
type Config struct {
	// Methods are the request methods the middleware handles; others pass
	// through untouched. Nil means POST and PATCH.
	Methods []string

	// Required makes a key mandatory for Methods: a request without one
	// gets 400. False lets such requests through without protection.
	Required bool

	// Principal returns who is calling: a user, tenant or API key ID from
	// the authenticated request. Keys are scoped by it, so one caller can
	// never replay another's stored response. Nil means one shared scope,
	// which is right only when every caller is trusted alike; keys then
	// protect each other only by being unguessable.
	Principal func(*http.Request) string

	// Route returns the operation a key is scoped to. Nil means the
	// ServeMux pattern that matched (r.Pattern, set when the middleware
	// wraps a handler registered on a ServeMux) or, when there is none,
	// the URL path. A pattern is the better scope: it is low-cardinality,
	// and reusing a key for another resource under the same route
	// ("/orders/1/pay" then "/orders/2/pay") is caught as a mismatch (422)
	// because the fingerprint covers the path.
	Route func(*http.Request) string

	// MaxKeyLength caps the key's length in bytes; longer keys get 400.
	// Zero or negative means 255.
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

	// TTL is how long a completed response is kept for replay. Zero or
	// negative means 24 hours.
	TTL time.Duration

	// Lease is how long a key stays locked without renewal, so a crashed
	// holder frees it: while the handler runs, the middleware renews the
	// lease every third of it (see DisableLeaseRenewal), and a process that
	// dies stops renewing. When the request's context has a deadline later
	// than Lease from now, the lease is that deadline plus one second
	// instead. Zero or negative means 30 seconds.
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
	// or negative means 2 seconds.
	StoreTimeout time.Duration

	// StoredHeaders are the response header fields stored and replayed.
	// Nil means all fields the handler set except hop-by-hop fields,
	// Content-Length (recomputed), Date and Set-Cookie (a credential,
	// kept out of the store unless listed here).
	StoredHeaders []string

	// RetryAfter is the Retry-After sent with 503 when the store fails, and
	// the most sent with 409 while the key is in flight (less when the
	// holder's lease ends sooner). Zero or negative means 1 second.
	RetryAfter time.Duration

	// FailOpen runs requests without protection when the store fails,
	// instead of refusing them with 503. A retry may then run twice: use
	// it only where a duplicate is cheaper than an outage.
	FailOpen bool

	// DocsURL, if set, is the problem "type" of error responses and is
	// linked from them (Link: <DocsURL>; rel="describedby"), as the draft
	// asks. Empty means "about:blank".
	DocsURL string

	// Logger receives store failures, failed lease renewals and lost
	// leases. Nil means slog.Default().
	Logger *slog.Logger

	// Observer receives an EventIdempotency per decision. Nil means none.
	Observer event.Observer
}

// Middleware returns HTTP middleware that makes Methods requests carrying an
// Idempotency-Key (draft-ietf-httpapi-idempotency-key-header) safe to
// retry: the handler runs once per key, and retries get the stored response.
//
// For each request with a key, scoped by Principal, method and Route:
//
//   - first time: the key is locked in store with a lease, the handler runs,
//     and its response (status, StoredHeaders, body) is stored for TTL;
//   - the same key and payload again: the stored response is replayed byte
//     for byte with "Idempotent-Replayed: true"; the handler does not run;
//   - the same key while the first request is still running: 409 with
//     Retry-After;
//   - the same key with another payload (method, path, query, body): 422;
//   - a malformed key, or none when Required: 400; a body over
//     MaxBodyBytes: 413.
//
// A 5xx response, a panic (re-raised after releasing), a hijacked
// connection, and a handler that returns without writing after its client
// went away release the key instead of storing, so a later retry runs the
// handler again; every other response (2xx, 3xx, 4xx) is stored. When the
// store fails the request is refused with 503 and Retry-After (or run
// unprotected with FailOpen), and logged.
//
// While the handler runs, its key's lease is renewed every third of it, so
// a slow handler keeps its key and a process that dies frees it within a
// lease. Should renewals fail until the lease ends (a long store outage),
// the handler still finishes and its client gets its response, but a retry
// may then run the handler again and the first response is not stored;
// both are logged. A handler about to commit a side effect that must not
// happen twice can make sure it still holds its key: Held tells it without
// I/O, and Confirm extends the lease with one store call.
//
// It panics if store is nil. The returned middleware is safe for concurrent
// use.
func Middleware(store Store, cfg Config) func(http.Handler) http.Handler {
	if store == nil {
		panic("idempotency: nil Store")
	}
	m := newMiddleware(store, cfg)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(w, r, next)
		})
	}
}

type middleware struct {
	store            Store
	cfg              Config
	methods          []string
	maxKeyLen        int
	maxBody          int64
	maxResp          int
	ttl              time.Duration
	lease            time.Duration
	storeTimeout     time.Duration
	retryAfter       time.Duration
	keep             func(name string) bool
	log              *slog.Logger
	problemType      string
	retryAfterHeader string
}

// notStored are the fields never stored by default.
var notStored = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Transfer-Encoding": true, "Te": true, "Trailer": true, "Upgrade": true,
	"Content-Length": true, "Date": true, "Set-Cookie": true,
	HeaderReplayed: true, HeaderBodyOmitted: true,
}

func newMiddleware(store Store, cfg Config) *middleware {
	m := &middleware{
		store:        store,
		cfg:          cfg,
		methods:      cfg.Methods,
		maxKeyLen:    positiveOr(cfg.MaxKeyLength, DefaultMaxKeyLength),
		maxBody:      nonZeroOr(cfg.MaxBodyBytes, DefaultMaxBodyBytes),
		maxResp:      nonZeroOr(cfg.MaxResponseBytes, DefaultMaxResponseBytes),
		ttl:          positiveOr(cfg.TTL, DefaultTTL),
		lease:        positiveOr(cfg.Lease, DefaultLease),
		storeTimeout: positiveOr(cfg.StoreTimeout, DefaultStoreTimeout),
		retryAfter:   positiveOr(cfg.RetryAfter, DefaultRetryAfter),
		log:          cfg.Logger,
		problemType:  cfg.DocsURL,
	}
	if m.methods == nil {
		m.methods = []string{http.MethodPost, http.MethodPatch}
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.problemType == "" {
		m.problemType = "about:blank"
	}
	m.retryAfterHeader = retryAfterSeconds(m.retryAfter)
	if cfg.StoredHeaders == nil {
		m.keep = func(name string) bool { return !notStored[name] }
	} else {
		keep := make(map[string]bool, len(cfg.StoredHeaders))
		for _, name := range cfg.StoredHeaders {
			if name = http.CanonicalHeaderKey(name); name != "Content-Length" {
				keep[name] = true
			}
		}
		m.keep = func(name string) bool { return keep[name] }
	}
	return m
}

// nonZeroOr returns def for zero, v otherwise (negative means no limit).
func nonZeroOr[T int | int64](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// positiveOr returns def for zero or negative, v otherwise: a negative TTL
// or lease would leave a key unprotected.
func positiveOr[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !slices.Contains(m.methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	key, err := parseKey(r.Header.Values(HeaderKey), m.maxKeyLen)
	switch {
	case errors.Is(err, ErrNoKey):
		if !m.cfg.Required {
			next.ServeHTTP(w, r)
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

	body, status, err := m.readBody(r)
	if err != nil {
		m.problem(w, status, http.StatusText(status), err.Error())
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	fp := fingerprint(r, body)

	ctx := r.Context()
	var principal string
	if m.cfg.Principal != nil {
		principal = m.cfg.Principal(r)
	}
	route := m.route(r)
	skey := scopedKey(principal, r.Method, route, key)

	lease := m.leaseFor(ctx)
	begun := time.Now()
	bctx, cancel := context.WithTimeout(ctx, m.storeTimeout)
	res, err := m.store.Begin(bctx, skey, fp, lease)
	cancel()
	if err == nil && (res.State < StateAcquired || res.State > StateMismatch ||
		res.State == StateCompleted && (res.Response == nil || res.Response.Status < 100 || res.Response.Status > 999)) {
		err = fmt.Errorf("idempotency: store returned invalid result %v", res.State)
	}
	if err != nil {
		if ctx.Err() != nil {
			return // the client is gone; nothing to answer, nothing ran
		}
		m.storeFailed(w, r, next, route, "begin", err)
		return
	}

	switch res.State {
	case StateAcquired:
		m.run(w, r, next, route, skey, res.Token, lease, begun)
	case StateInFlight:
		m.emit(r, event.ReasonConflict, nil)
		ra := m.retryAfterHeader
		if res.RetryIn > 0 && res.RetryIn < m.retryAfter {
			ra = retryAfterSeconds(res.RetryIn)
		}
		w.Header().Set("Retry-After", ra)
		m.problem(w, http.StatusConflict, "A request is outstanding for this Idempotency-Key",
			"A request with the same Idempotency-Key for the same operation is still being processed; retry after the delay in Retry-After.")
	case StateCompleted:
		m.emit(r, event.ReasonReplayed, nil)
		replay(w, res.Response)
	case StateMismatch:
		m.emit(r, event.ReasonMismatch, nil)
		m.problem(w, http.StatusUnprocessableEntity, "Idempotency-Key is already used",
			"This Idempotency-Key was used with a different request payload; an Idempotency-Key must not be reused across different payloads of this operation.")
	}
}

// readBody reads the whole request body, up to maxBody.
func (m *middleware) readBody(r *http.Request) ([]byte, int, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0, nil
	}
	if m.maxBody >= 0 && r.ContentLength > m.maxBody {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("idempotency: request body of %d bytes is over the limit of %d", r.ContentLength, m.maxBody)
	}
	src := io.Reader(r.Body)
	if m.maxBody >= 0 {
		src = io.LimitReader(r.Body, m.maxBody+1)
	}
	body, err := io.ReadAll(src)
	r.Body.Close()
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("idempotency: reading the request body: %w", err)
	}
	if m.maxBody >= 0 && int64(len(body)) > m.maxBody {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("idempotency: request body is over the limit of %d bytes", m.maxBody)
	}
	return body, 0, nil
}

// fingerprint hashes what makes two requests with one key the same request:
// method, escaped path, query and body, each length-prefixed.
func fingerprint(r *http.Request, body []byte) Fingerprint {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, s := range [...]string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(body)))])
	h.Write(body)
	var fp Fingerprint
	h.Sum(fp[:0])
	return fp
}

func (m *middleware) route(r *http.Request) string {
	switch {
	case m.cfg.Route != nil:
		return m.cfg.Route(r)
	case r.Pattern != "":
		return r.Pattern
	}
	return r.URL.Path
}

func (m *middleware) leaseFor(ctx context.Context) time.Duration {
	lease := m.lease
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl) + time.Second; d > lease {
			lease = d
		}
	}
	return lease
}

// run runs the handler under the lock token holds, locked at begun for
// lease and renewed while it runs, then stores or releases.
func (m *middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, route, skey, token string, lease time.Duration, begun time.Time) {
	rec := &recorder{w: w, max: m.maxResp, keep: m.keep}
	rn, hr := m.renew(r, route, skey, token, lease, begun)
	returned := false
	defer func() {
		if returned {
			return
		}
		// A panic, or runtime.Goexit (v == nil). Release first so the
		// retry can run, then let it go on up.
		v := recover()
		rn.stop()
		m.release(r, route, skey, token, "panic")
		if v != nil {
			panic(v)
		}
	}()
	next.ServeHTTP(rec, hr)
	returned = true
	// A handler that wrote nothing once its context was done gave up: its
	// client went away, or (CancelOnLeaseLost) its lease was lost. Ask
	// before stop, which cancels that context.
	gaveUp := rec.status == 0 && hr.Context().Err() != nil
	// Stop renewing before finishing the key, so that no renewal runs
	// after the handler's request is over.
	rn.stop()

	switch {
	case rec.hijacked:
		m.release(r, route, skey, token, "hijacked")
		return
	case gaveUp && r.Context().Err() != nil:
		m.release(r, route, skey, token, "client gone, nothing written")
		return
	case gaveUp:
		m.release(r, route, skey, token, "lease lost, nothing written")
		return
	case rec.status >= 500:
		m.release(r, route, skey, token, "status "+strconv.Itoa(rec.status))
		return
	}
	resp := &Response{Status: rec.status, Header: rec.header, BodyOmitted: rec.omitted}
	if resp.Status == 0 { // nothing written: net/http sends 200 and the header as it is now
		resp.Status = http.StatusOK
		resp.Header = storedHeader(w.Header(), m.keep)
	}
	if !rec.omitted && rec.body.Len() > 0 {
		resp.Body = rec.body.Bytes()
	}
	ctx, cancel := m.detached(r)
	defer cancel()
	if err := m.store.Complete(ctx, skey, token, resp, m.ttl); err != nil {
		m.emit(r, event.ReasonStoreError, err)
		msg := "idempotency: storing the response failed; a retry may run the request again"
		switch {
		case errors.Is(err, ErrLockLost) && m.cfg.DisableLeaseRenewal:
			msg = "idempotency: the key's lease expired before the handler finished; a retry may run the request again (raise Config.Lease above the handler's longest run, or turn lease renewal back on)"
		case errors.Is(err, ErrLockLost):
			msg = "idempotency: the key's lease expired before the handler finished (its renewal failed or found it lost; see the earlier log lines); a retry may run the request again"
		}
		m.log.ErrorContext(r.Context(), msg, "err", err, "method", r.Method, "route", route, "status", resp.Status)
		return
	}
	if rec.omitted {
		m.log.WarnContext(r.Context(), "idempotency: response body over MaxResponseBytes; stored without its body",
			"method", r.Method, "route", route, "limit", m.maxResp)
	}
	m.emit(r, event.ReasonStored, nil)
}

// detached returns a context for finishing the key: it keeps the request's
// values but not its cancellation, because the client's connection being
// cut (the very case keys exist for) must not stop the response from being
// stored.
func (m *middleware) detached(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), m.storeTimeout)
}

func (m *middleware) release(r *http.Request, route, skey, token, why string) {
	ctx, cancel := m.detached(r)
	defer cancel()
	if err := m.store.Release(ctx, skey, token); err != nil {
		if errors.Is(err, ErrLockLost) {
			// The store works; the key was simply no longer this
			// request's to release.
			m.log.WarnContext(r.Context(), "idempotency: the key was no longer held when releasing it (its lease had ended, or a retry took it over); nothing to release",
				"method", r.Method, "route", route, "why", why)
			return
		}
		m.emit(r, event.ReasonStoreError, err)
		m.log.ErrorContext(r.Context(), "idempotency: releasing the key failed; retries get 409 until its lease ends",
			"err", err, "method", r.Method, "route", route, "why", why)
		return
	}
	m.emit(r, event.ReasonReleased, nil)
}

func (m *middleware) storeFailed(w http.ResponseWriter, r *http.Request, next http.Handler, route, op string, err error) {
	m.emit(r, event.ReasonStoreError, err)
	if m.cfg.FailOpen {
		m.log.WarnContext(r.Context(), "idempotency: store failed; running the request without duplicate protection (FailOpen)",
			"op", op, "err", err, "method", r.Method, "route", route)
		next.ServeHTTP(w, r)
		return
	}
	m.log.ErrorContext(r.Context(), "idempotency: store failed; refusing the request with 503 rather than running it unprotected",
		"op", op, "err", err, "method", r.Method, "route", route)
	w.Header().Set("Retry-After", m.retryAfterHeader)
	m.problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable",
		"The request was not processed; retry it with the same Idempotency-Key after the delay in Retry-After.")
}

// storedHeader copies the fields of h that keep selects; nil if none.
func storedHeader(h http.Header, keep func(string) bool) http.Header {
	var out http.Header
	for k, vs := range h {
		if len(vs) == 0 || !keep(k) {
			continue
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

func (m *middleware) emit(r *http.Request, reason string, err error) {
	if m.cfg.Observer == nil {
		return
	}
	m.emitOp(r.Context(), operation(r), reason, err)
}

// operation is the Operation of r's events.
func operation(r *http.Request) string {
	if op := event.Operation(r.Context()); op != "" {
		return op
	}
	return r.Pattern // low-cardinality; a raw path never goes here
}

func (m *middleware) emitOp(ctx context.Context, op, reason string, err error) {
	if m.cfg.Observer == nil {
		return
	}
	m.cfg.Observer.Observe(ctx, event.Event{
		Kind:      event.Idempotency,
		Operation: op,
		Reason:    reason,
		Err:       err,
	})
}

type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// problem writes an RFC 9457 problem document.
func (m *middleware) problem(w http.ResponseWriter, status int, title, detail string) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if m.cfg.DocsURL != "" {
		h.Set("Link", "<"+m.cfg.DocsURL+`>; rel="describedby"`)
	}
	b, _ := json.Marshal(problemBody{Type: m.problemType, Title: title, Status: status, Detail: detail})
	b = append(b, '\n')
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// retryAfterSeconds formats d as delay-seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	return strconv.FormatInt(max(s, 1), 10)
}
