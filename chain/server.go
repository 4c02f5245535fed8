package chain

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/guardrail-go/guardrail/event"
)

// ErrInvalidConfig is wrapped by the error New returns for a Config it
// cannot use.
var ErrInvalidConfig = errors.New("chain: invalid config")

// Config configures a Server. The zero Config is valid: the default cap,
// no observer. It is a plain value that New reads once; the functions it
// holds (Key, Admission) must be safe for concurrent use.
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
	// the amplification it arrived with, for a histogram of it, and an
	// event.Shed (reason event.ReasonCohort) for every request refused at
	// the door for its cohort. Nil means none.
	Observer event.Observer

	// Key, when set, makes this server the edge that gives requests their
	// cohort: the key of the request's user or session (an authenticated
	// id, never something the client picks freely), from which
	// CohortOf derives the cohort, rotated every CohortRotation. A request
	// whose key is empty gets no cohort. When nil, the cohort is read from
	// the request's X-Request-Cohort, as an internal tier does; an
	// edge must set Key, or clients could pick the cohort least shed.
	Key func(*http.Request) string
	// CohortRotation is how long a key keeps its cohort; zero means
	// DefaultCohortRotation. It must not be negative.
	CohortRotation time.Duration
	// Admission, when set, returns the lowest cohort the server admits now
	// (0 admits every one): its own shedder's level
	// (shed.Shedder.AdmissionLevel), the highest its dependencies reported
	// (guardhttp.Transport.AdmissionLevel), or the larger of both. A request
	// of a lower cohort is refused at the door, before next runs: 503, a
	// Retry-After of 1 s and HeaderNotProcessed. Every answer carries the
	// level in HeaderAdmission when it is above 0, so that the callers'
	// servers refuse at their own doors what this one would refuse.
	// Requests without a cohort are never refused for it. Nil means none.
	Admission func() int
}

// Server is the chain's server side: see Middleware. It is safe for
// concurrent use.
type Server struct {
	name      string
	max       int
	obs       event.Observer
	key       func(*http.Request) string
	rotate    time.Duration
	admission func() int
}

// New returns a Server for cfg, or an error wrapping ErrInvalidConfig.
func New(cfg Config) (*Server, error) {
	var errs []error
	if cfg.MaxAmplification < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.MaxAmplification is %d; want 1 or more, or zero for %d", ErrInvalidConfig, cfg.MaxAmplification, DefaultMaxAmplification))
	}
	if cfg.CohortRotation < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.CohortRotation is %v; want a positive duration, or zero for %v", ErrInvalidConfig, cfg.CohortRotation, DefaultCohortRotation))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s := &Server{name: cfg.Name, max: cfg.MaxAmplification, obs: cfg.Observer,
		key: cfg.Key, rotate: cfg.CohortRotation, admission: cfg.Admission}
	if s.max == 0 {
		s.max = DefaultMaxAmplification
	}
	return s, nil
}

// MaxAmplification returns the cap in force.
func (s *Server) MaxAmplification() int { return s.max }

// Begin returns ctx carrying a new State for a request that arrived with
// the amplification value amp and the cohort value cohort (as read from
// the wire; "" means 1 and none), and reports the request to the
// Observer. It is what Middleware does before it calls next, for a
// transport other than HTTP (guardgrpc's server interceptors); Config.Key
// is HTTP's.
func (s *Server) Begin(ctx context.Context, amp, cohort string) (context.Context, *State) {
	sv := &served{}
	s.begin(ctx, amp, sv)
	if c, ok := ParseCohort(cohort); ok {
		sv.st.SetCohort(c)
	}
	return &sv.ctx, &sv.st
}

// Level returns the admission level in force (Config.Admission's), 0
// without one.
func (s *Server) Level() int {
	if s.admission == nil {
		return 0
	}
	return min(max(s.admission(), 0), Cohorts)
}

// Refuses reports whether the request st serves is refused for its cohort
// at the level in force, and that level. A refused request is reported to
// the Observer. It is what Middleware does before it calls next.
func (s *Server) Refuses(ctx context.Context, st *State) (level int, refused bool) {
	level = s.Level()
	c, ok := st.Cohort()
	if !ok || c >= level {
		return level, false
	}
	if s.obs != nil {
		s.obs.Observe(ctx, event.Event{Kind: event.Shed, Dependency: s.name, Operation: event.Operation(ctx),
			Reason: event.ReasonCohort, Limit: level, Remaining: -1})
	}
	return level, true
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
		switch {
		case s.key != nil:
			if k := s.key(r); k != "" {
				sv.st.SetCohort(CohortOf(k, time.Now(), s.rotate))
			}
		default:
			if vs := r.Header[HeaderCohort]; len(vs) > 0 {
				if c, ok := ParseCohort(vs[0]); ok {
					sv.st.SetCohort(c)
				}
			}
		}
		level, refused := s.Refuses(r.Context(), &sv.st)
		sv.w = markWriter{ResponseWriter: w, st: &sv.st, level: level}
		if refused {
			sv.st.MarkNotProcessed()
			w.Header()["Retry-After"] = oneSecond
			sv.w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(&sv.w, r.WithContext(&sv.ctx))
		if !sv.w.wrote {
			// An answer with neither status nor body: net/http writes 200
			// after this returns, with the headers as they are now.
			sv.w.wrote = true
			sv.w.mark(http.StatusOK)
		}
	})
}

// markWriter adds the State's markers to the answer when its status is
// written.
type markWriter struct {
	http.ResponseWriter
	st    *State
	level int // the admission level at the request's arrival, told to the caller
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
	if w.level > 0 {
		h[HeaderAdmission] = []string{strconv.Itoa(w.level)}
	}
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

// markerValue and oneSecond are shared by every answer and never
// modified: cap == len, so an append elsewhere copies.
var (
	markerValue = []string{"1"}
	oneSecond   = []string{"1"}
)

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
