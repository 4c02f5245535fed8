package shed

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/deadline"
)

// Middleware returns a handler that admits each request through the Shedder
// before calling next. A refused request is answered at once with 503
// Service Unavailable, a Retry-After header (Config.RetryAfter) and no body;
// next does not run. An admitted request's slot is released when next
// returns, and its latency feeds the adaptive limit unless the client went
// away (the request's context was cancelled).
//
// The priority comes from Config.Priority, or the X-Request-Priority header
// capped at Config.MaxHeaderPriority; a request is a retry per
// Config.IsRetry, or when its X-Retry-Attempt header is above 0.
func (s *Shedder) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, err := s.acquire(r.Context(), s.requestPriority(r), s.requestIsRetry(r))
		if err != nil {
			chain.MarkNotProcessed(r.Context()) // next never runs
			// Shared, never modified: cap == len, so an append elsewhere copies.
			w.Header()["Retry-After"] = s.retryAfterHeader()
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		defer release(tok, r)
		next.ServeHTTP(w, r)
	})
}

func release(tok Token, r *http.Request) {
	if r.Context().Err() == context.Canceled {
		tok.Ignore()
		return
	}
	tok.Release()
}

func (s *Shedder) requestPriority(r *http.Request) Priority {
	if s.priorityFn != nil {
		return s.priorityFn(r)
	}
	return headerPriorityOf(r.Header, s.maxHeader)
}

func (s *Shedder) requestIsRetry(r *http.Request) bool {
	if s.isRetryFn != nil {
		return s.isRetryFn(r)
	}
	v := r.Header[deadline.HeaderRetryAttempt]
	if len(v) == 0 {
		return false
	}
	n, ok := ParseRetryAttempt(v[0])
	return ok && n > 0
}

// headerPriorityOf returns the priority claimed by h's X-Request-Priority
// header, capped at maxPriority (an invalid maxPriority means Normal). A
// missing or unknown value is Normal, also capped: a server that allows at
// most Low treats every request as Low or below.
func headerPriorityOf(h http.Header, maxPriority Priority) Priority {
	p := Normal
	if v := h[HeaderPriority]; len(v) > 0 {
		if q, ok := ParsePriority(v[0]); ok {
			p = q
		}
	}
	return min(p, maxPriority.normalize())
}

// ParseRetryAttempt parses an X-Retry-Attempt value: a decimal attempt
// number of at most 9 digits, spaces around it ignored. It reports false for
// anything else (signs, garbage, absurd lengths), which the middleware treats
// as an original request.
func ParseRetryAttempt(s string) (int, bool) {
	if len(s) > 32 {
		return 0, false
	}
	s = strings.TrimSpace(s)
	if s == "" || len(s) > 9 || s[0] < '0' || s[0] > '9' {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, false
	}
	return n, true
}
