package chain

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/guardrail-go/guardrail/event"
)

// ErrInvalidConfig is wrapped by the error New returns for a Config it
// cannot use.
var ErrInvalidConfig = errors.New("chain: invalid config")

// Config configures a Server. The zero Config is valid: the default cap,
// no observer.
type Config struct {
	// Name names the server in events (event.Event.Dependency).
	Name string
	// MaxAmplification caps the sends of one user request that the calls
	// this server makes for it may add up to: a retry whose attempt would
	// take the request's amplification times its attempt number past the
	// cap is refused locally (guardrail.ErrBudgetExhausted, reason
	// event.ReasonAmplification), and the answer carries HeaderRetried.
	// First attempts are never refused. Zero means
	// DefaultMaxAmplification; it must not be negative.
	MaxAmplification int
	// Observer receives an event.Amplification for every request, with
	// the amplification it arrived with, for a histogram of it. Nil means
	// none.
	Observer event.Observer
}

// Server is the chain's server side: see Middleware. It is safe for
// concurrent use.
type Server struct {
	name string
	max  int
	obs  event.Observer
}

// New returns a Server for cfg, or an error wrapping ErrInvalidConfig.
func New(cfg Config) (*Server, error) {
	if cfg.MaxAmplification < 0 {
		return nil, fmt.Errorf("%w: Config.MaxAmplification is %d; want 1 or more, or zero for %d", ErrInvalidConfig, cfg.MaxAmplification, DefaultMaxAmplification)
	}
	s := &Server{name: cfg.Name, max: cfg.MaxAmplification, obs: cfg.Observer}
	if s.max == 0 {
		s.max = DefaultMaxAmplification
	}
	return s, nil
}

// MaxAmplification returns the cap in force.
func (s *Server) MaxAmplification() int { return s.max }

// Begin returns ctx carrying a new State for a request that arrived with
// the amplification value v (as read from the wire; "" means 1), and
// reports the request to the Observer. It is what Middleware does before
// it calls next, for a transport other than HTTP (guardgrpc's server
// interceptors).
func (s *Server) Begin(ctx context.Context, v string) (context.Context, *State) {
	sv := &served{}
	s.begin(ctx, v, sv)
	return &sv.ctx, &sv.st
}

// served is what the chain keeps for one request, in one allocation: its
// State, the context that carries it, and the writer that marks its
// answer.
type served struct {
	ctx stateCtx
	st  State
	w   markWriter
}

// stateCtx is a context that carries a State, as NewContext's does,
// without an allocation of its own.
type stateCtx struct {
	context.Context
	st *State
}

func (c *stateCtx) Value(key any) any {
	if key == (stateKey{}) {
		return c.st
	}
	return c.Context.Value(key)
}

// begin fills sv for a request with context ctx and amplification value v.
func (s *Server) begin(ctx context.Context, v string, sv *served) {
	amp := 1
	if v != "" {
		if n, ok := ParseAmplification(v); ok {
			amp = n
		}
	}
	sv.st.amp, sv.st.max = amp, s.max
	sv.ctx = stateCtx{Context: ctx, st: &sv.st}
	if s.obs != nil {
		s.obs.Observe(ctx, event.Event{Kind: event.Amplification, Dependency: s.name, Amplification: amp, Limit: s.max, Remaining: -1})
	}
}

// Middleware reads the request's X-Retry-Amplification, runs next with a
// State in the request's context, and, when next (or a middleware inside
// this one) writes an error status (429 or 5xx), adds the markers the
// State collected: HeaderRetried when a guarded call gave up after
// retries, HeaderNotProcessed when a refusing middleware recorded that
// the handler never ran. A HeaderNotProcessed that the handler set itself
// is removed, on every answer: only the State may grant it, so a handler
// cannot claim by accident that nothing ran after it did work. A
// HeaderRetried that the handler set (a reverse proxy copying the
// answer of the server behind it) is kept.
func (s *Server) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v string
		if vs := r.Header[HeaderAmplification]; len(vs) > 0 {
			v = vs[0]
		}
		sv := &served{}
		s.begin(r.Context(), v, sv)
		sv.w = markWriter{ResponseWriter: w, st: &sv.st}
		next.ServeHTTP(&sv.w, r.WithContext(&sv.ctx))
	})
}

// markWriter adds the State's markers to the answer when its status is
// written.
type markWriter struct {
	http.ResponseWriter
	st    *State
	wrote bool
}

func (w *markWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.wrote = true
		w.mark(code)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *markWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.wrote = true
		w.mark(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

func (w *markWriter) mark(code int) {
	h := w.ResponseWriter.Header()
	delete(h, HeaderNotProcessed)
	if code != http.StatusTooManyRequests && code < 500 {
		return
	}
	switch {
	case w.st.NotProcessed():
		h[HeaderNotProcessed] = markerValue
	case w.st.Retried():
		h[HeaderRetried] = markerValue
	}
}

// markerValue is shared by every answer and never modified: cap == len,
// so an append elsewhere copies.
var markerValue = []string{"1"}

// Flush flushes the answer, as http.Flusher.
func (w *markWriter) Flush() {
	if !w.wrote {
		w.wrote = true
		w.mark(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack hands the connection over, as http.Hijacker.
func (w *markWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := w.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, fmt.Errorf("chain: %T does not support hijacking", w.ResponseWriter)
}

// Unwrap returns the writer underneath, for http.ResponseController.
func (w *markWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
