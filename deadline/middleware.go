package deadline

import (
	"context"
	"net/http"
	"time"
)

// Server-side defaults.
const (
	// DefaultMax is the longest a request may ask a server to work when the
	// server sets no maximum of its own.
	DefaultMax = 30 * time.Second
	// DefaultReserve is kept back from the caller's deadline for writing the
	// answer.
	DefaultReserve = 10 * time.Millisecond
)

// Config configures Middleware. The zero value is ready to use.
type Config struct {
	// Max caps the deadline a request may ask for, and is the deadline of a
	// request that announces none: a caller cannot make the server work
	// longer than the server allows. Zero means DefaultMax; a negative value
	// means no cap, and no deadline for requests without the headers.
	Max time.Duration

	// Reserve is subtracted from the caller's time left so the answer can be
	// written before the caller gives up. Zero means DefaultReserve; a
	// negative value means none.
	Reserve time.Duration

	// Expired answers a request whose deadline has already passed (or is
	// used up by the reserve). The handler never runs for it. Nil means a
	// 504 Gateway Timeout with a short plain-text body.
	Expired http.Handler

	// Now returns the current time. Nil means time.Now.
	Now func() time.Time
}

// Middleware reads the caller's deadline from X-Request-Timeout (trusted
// first: it is immune to clock skew) or X-Request-Deadline, caps it at
// cfg.Max, keeps cfg.Reserve back, and runs next with a request context that
// ends then. Values that do not parse (negative, fractional, garbage, too
// long) are ignored, as if absent. A request whose deadline has passed is
// answered at once by cfg.Expired and next never runs.
//
// A client that disconnects already cancels the request context in
// net/http; with the deadline in the same context, work next starts
// downstream with r.Context() stops in both cases.
func Middleware(cfg Config, next http.Handler) http.Handler {
	limit := cfg.Max
	if limit == 0 {
		limit = DefaultMax
	}
	reserve := cfg.Reserve
	switch {
	case reserve == 0:
		reserve = DefaultReserve
	case reserve < 0:
		reserve = 0
	}
	expired := cfg.Expired
	if expired == nil {
		expired = http.HandlerFunc(writeExpired)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := now()
		left, ok := FromHeader(r.Header, t, limit)
		if !ok {
			if limit < 0 {
				next.ServeHTTP(w, r)
				return
			}
			left = limit
		}
		left -= reserve
		if left <= 0 {
			expired.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithDeadline(r.Context(), t.Add(left))
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
