// Package chain carries what a call chain needs on the wire so that every
// tier may retry and the chain still does not multiply its load: whether an
// answer was produced after retries were already spent, whether a request
// was refused before any work, and how many sends of the user's original
// request a request represents.
//
// "Retry at one tier only" is advice that holds only while every team
// follows it; these signals make it hold when they do not:
//
//	X-Already-Retried: 1      on an error answer: the server's own guarded
//	                          calls failed after retries, or were refused for
//	                          budget, an open breaker or the throttle.
//	                          Retrying it multiplies the load on a failing
//	                          chain, so a guardrail client does not, and the
//	                          tier that gives up passes it on.
//	X-Not-Processed: 1        on an error answer: the request was refused
//	                          before its handler ran (shed, rate-limited,
//	                          its deadline already passed). Nothing ran, so
//	                          any method may be retried, within the caller's
//	                          deadline and budget.
//	X-Retry-Amplification: n  on a request: the sends of the user's original
//	                          request this request represents, the product
//	                          of the attempt numbers along the chain. Absent
//	                          means 1.
//
// gRPC carries the same signals as metadata of the same names in lower
// case: the amplification as request metadata, the two markers as
// trailers.
//
// A Server's Middleware is the outermost middleware of a server that calls
// other services: it reads the request's amplification, puts a State in
// the request's context, and writes the markers the State collected when
// the answer is written. Do (package guardrail) records in the State of
// its context that it gave up after retries, and refuses a retry that
// would take the chain past the Server's MaxAmplification; the client
// transports (guardhttp, guardgrpc) send the amplification and read the
// markers. The refusing middlewares (shed, deadline, ratelimit) record
// that nothing ran.
//
// The expected middleware order is
//
//	tracing → chain → deadline → auth → rate limit → shed → router → idempotency → handler
//
// so that every refusal at the door is seen by the chain's Middleware. A
// refusing middleware outside it sends no marker: the answer is then an
// ordinary 503 or 429, which guardrail clients treat as before.
package chain

import (
	"context"
	"math"
	"sync/atomic"
)

// The wire names. HTTP uses them as written; gRPC as metadata keys in
// lower case (MDRetried, MDNotProcessed, MDAmplification).
const (
	// HeaderRetried marks an error answer produced after the server's own
	// guarded calls were retried, or refused for budget, an open breaker
	// or the throttle. Its value is "1".
	HeaderRetried = "X-Already-Retried"
	// HeaderNotProcessed marks an error answer given before the request's
	// handler ran. Its value is "1".
	HeaderNotProcessed = "X-Not-Processed"
	// HeaderAmplification carries the sends of the user's original
	// request that a request represents, a decimal number of at least 1.
	HeaderAmplification = "X-Retry-Amplification"

	// MDRetried is HeaderRetried as gRPC trailer metadata.
	MDRetried = "x-already-retried"
	// MDNotProcessed is HeaderNotProcessed as gRPC trailer metadata.
	MDNotProcessed = "x-not-processed"
	// MDAmplification is HeaderAmplification as gRPC request metadata.
	MDAmplification = "x-retry-amplification"
)

// MaxAmplification is the largest amplification read from the wire or
// sent: larger values are read as this one, and products saturate at it,
// so that no peer can make the arithmetic overflow.
const MaxAmplification = 1 << 20

// DefaultMaxAmplification is the cap a Server applies when its Config
// leaves MaxAmplification zero: beyond ten sends of one user request, the
// calls a server makes for it no longer retry. Ten is the point past
// which a chain that retries at each tier has turned an outage into an
// overload of its own making (three tiers of three attempts are 27).
const DefaultMaxAmplification = 10

// State is what the chain knows about one request a server is serving:
// the amplification it arrived with, the cap on the amplification its
// downstream calls may add up to, and the markers its answer will carry.
// A Server's Middleware puts one in the request's context; it is safe for
// concurrent use, since a handler may make its downstream calls from
// several goroutines.
type State struct {
	amp     int
	max     int
	cohort  int16 // the cohort + 1; 0: none
	retried atomic.Bool
	refused atomic.Bool
}

// NewState returns a State for a request that arrived with amplification
// amp (values below 1 mean 1) under the cap max (0 means no cap).
func NewState(amp, max int) *State {
	return &State{amp: clampAmp(amp), max: max}
}

type stateKey struct{}

// NewContext returns a copy of ctx that carries s.
func NewContext(ctx context.Context, s *State) context.Context {
	return context.WithValue(ctx, stateKey{}, s)
}

// FromContext returns the State ctx carries, or nil.
func FromContext(ctx context.Context) *State {
	s, _ := ctx.Value(stateKey{}).(*State)
	return s
}

// Amplification returns the amplification of the request being served,
// 1 for a nil State.
func (s *State) Amplification() int {
	if s == nil {
		return 1
	}
	return s.amp
}

// Outgoing returns the amplification attempt n (1-based) of a downstream
// call sends: the request's own times n, saturating at MaxAmplification.
func (s *State) Outgoing(n int) int {
	return mul(s.Amplification(), max(n, 1))
}

// AllowsAttempt reports whether attempt n (1-based) of a downstream call
// keeps the chain within the cap: its Outgoing(n) is at most the cap. The
// first attempt is always allowed; a nil State allows every attempt.
func (s *State) AllowsAttempt(n int) bool {
	if s == nil || s.max <= 0 || n <= 1 {
		return true
	}
	return s.Outgoing(n) <= s.max
}

// MarkRetried records that a guarded call made for this request gave up
// after retries, or was refused for budget, an open breaker or the
// throttle, or got an answer that carried HeaderRetried: an error answer
// to this request then carries HeaderRetried too. A nil State does
// nothing.
func (s *State) MarkRetried() {
	if s != nil && !s.retried.Load() {
		s.retried.Store(true)
	}
}

// Retried reports whether MarkRetried was called.
func (s *State) Retried() bool { return s != nil && s.retried.Load() }

// MarkNotProcessed records that the request was refused before its handler
// ran. Only a middleware that refuses at the door calls it, just before it
// writes its refusal: an error answer then carries HeaderNotProcessed. A
// handler that refuses before doing any work (its first guarded call found
// the breaker open) may call it too. It is ignored once MarkRetried was
// called: a request for which a guarded call ran was processed. A nil
// State does nothing.
func (s *State) MarkNotProcessed() {
	if s != nil {
		s.refused.Store(true)
	}
}

// NotProcessed reports whether MarkNotProcessed was called and MarkRetried
// was not.
func (s *State) NotProcessed() bool {
	return s != nil && s.refused.Load() && !s.retried.Load()
}

// MarkNotProcessed calls MarkNotProcessed on the State ctx carries, if any.
func MarkNotProcessed(ctx context.Context) { FromContext(ctx).MarkNotProcessed() }

// Marks says which markers an answer carries, as read by a client. A
// plain value; guardrail.Verdict.Marked says what they mean for a retry.
type Marks struct {
	// Retried: the answer carried HeaderRetried (MDRetried).
	Retried bool
	// NotProcessed: the answer carried HeaderNotProcessed
	// (MDNotProcessed).
	NotProcessed bool
}

// MarksOf reads the markers from the values of an answer's HeaderRetried
// and HeaderNotProcessed (or their gRPC twins): the first value of each
// counts, as ParseMarker reads it.
func MarksOf(retried, notProcessed []string) Marks {
	return Marks{
		Retried:      len(retried) > 0 && ParseMarker(retried[0]),
		NotProcessed: len(notProcessed) > 0 && ParseMarker(notProcessed[0]),
	}
}

// ParseMarker reports whether v, the value of a marker header or trailer,
// sets the marker: "1", with spaces around it ignored. Anything else is
// ignored, as if the marker were absent.
func ParseMarker(v string) bool {
	return trimSpace(v) == "1"
}

// ParseAmplification parses an X-Retry-Amplification value: a decimal
// number of at most 9 digits, spaces around it ignored, read as at least 1
// and at most MaxAmplification. It reports false for anything else (signs,
// garbage, absurd lengths), which a server reads as 1.
func ParseAmplification(v string) (int, bool) {
	n, ok := parseDigits(v, 9)
	if !ok {
		return 0, false
	}
	return clampAmp(n), true
}

// parseDigits parses a decimal number of at most maxLen digits, spaces
// around it ignored: no sign, nothing else.
func parseDigits(v string, maxLen int) (int, bool) {
	v = trimSpace(v)
	if v == "" || len(v) > maxLen {
		return 0, false
	}
	n := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func clampAmp(n int) int { return min(max(n, 1), MaxAmplification) }

// mul multiplies two amplifications in [1, MaxAmplification], saturating.
func mul(a, b int) int {
	if a <= 0 || b <= 0 {
		return 1
	}
	if a > math.MaxInt/b || a*b > MaxAmplification {
		return MaxAmplification
	}
	return a * b
}

func trimSpace(v string) string {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}
