package deadline

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/guardrail-go/guardrail/chain"
)

// Server-side defaults.
const (
	// defaultMax is the longest a request may ask a server to work when the
	// server sets no maximum of its own.
	defaultMax = 30 * time.Second
	// defaultReserve is kept back from the caller's deadline for writing the
	// answer.
	defaultReserve = 10 * time.Millisecond
)

// Config configures a Server. The zero value is valid: at most 30 s of
// work, a 10 ms reserve and a 504 for expired requests. It is a plain value
// that New copies; Expired and Now are called concurrently, from the
// requests' goroutines.
type Config struct {
	// Max caps the deadline a request may ask for, and is the deadline of a
	// request that announces none: a caller cannot make the server work
	// longer than the server allows. Zero means 30 s; a negative value
	// means no limit: no cap, and no deadline for requests without the
	// headers.
	Max time.Duration

	// Reserve is subtracted from the caller's time left so the answer can be
	// written before the caller gives up. Zero means 10 ms; a negative
	// value means no limit: nothing is kept back. A positive Reserve must
	// be below Max, or no request could ever run.
	Reserve time.Duration

	// Expired answers a request whose deadline has already passed (or is
	// used up by the reserve). The handler never runs for it. Nil means a
	// 504 Gateway Timeout with a short plain-text body.
	Expired http.Handler

	// Now returns the current time, on the clock the caller's absolute
	// X-Request-Deadline is compared with. Nil means time.Now. It only
	// measures the time left: the request context's deadline is always set
	// on the process's real clock, which is the one context timers use.
	Now func() time.Time
}

// Server is the server side of the deadline protocol: its Middleware gives
// each request a context that ends when the caller's deadline, capped at the
// server's own maximum and less a reserve, does. Build one with New. A
// Server holds only its configuration and is safe for concurrent use.
type Server struct {
	max     time.Duration // negative: no cap
	reserve time.Duration // never negative
	expired http.Handler
	now     func() time.Time
}

// ErrInvalidConfig is the sentinel of the error New returns for a Config
// whose fields cannot work together. The error names the field, what it
// held and what is allowed.
var ErrInvalidConfig = errors.New("deadline: invalid config")

// configError reports one invalid field. It Is ErrInvalidConfig.
type configError struct{ msg string }

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }

// New returns a Server configured by cfg, or an error that Is
// ErrInvalidConfig and names every field of cfg that is invalid. Max and
// Reserve take any value alone; only a Reserve that leaves nothing of Max
// is invalid.
func New(cfg Config) (*Server, error) {
	s := &Server{max: cfg.Max, reserve: cfg.Reserve, expired: cfg.Expired, now: cfg.Now}
	if s.max == 0 {
		s.max = defaultMax
	}
	switch {
	case s.reserve == 0:
		s.reserve = defaultReserve
	case s.reserve < 0:
		s.reserve = 0
	}
	if s.max > 0 && s.reserve >= s.max {
		return nil, &configError{fmt.Sprintf("deadline: Config.Reserve is %v (%v in force); want less than Config.Max's %v, or negative for none", cfg.Reserve, s.reserve, s.max)}
	}
	if s.expired == nil {
		s.expired = http.HandlerFunc(writeExpired)
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// Middleware reads the caller's deadline from X-Request-Timeout (trusted
// first: it is immune to clock skew) or X-Request-Deadline, caps it at
// Config.Max, keeps Config.Reserve back, and runs next with a request
// context that ends then. Values that do not parse (negative, fractional,
// garbage, too long) are ignored, as if absent. A request whose deadline has
// passed is answered at once by Config.Expired and next never runs.
//
// A client that disconnects already cancels the request context in
// net/http; with the deadline in the same context, work next starts
// downstream with r.Context() stops in both cases.
func (s *Server) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		left, ok := FromHeader(r.Header, s.now(), s.max)
		if !ok {
			if s.max < 0 {
				next.ServeHTTP(w, r)
				return
			}
			left = s.max
		}
		left -= s.reserve
		if left <= 0 {
			chain.MarkNotProcessed(r.Context()) // next never runs
			s.expired.ServeHTTP(w, r)
			return
		}
		// The time left was measured on Config.Now's clock; a context's
		// deadline is on the real one, so it is set relative to now there.
		ctx, cancel := context.WithTimeout(r.Context(), left)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func writeExpired(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusGatewayTimeout)
	_, _ = w.Write([]byte("deadline already passed\n"))
}
