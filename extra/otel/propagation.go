package otel

import (
	"net/http"

	gotel "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// Transport returns an http.RoundTripper that writes the trace context of
// each request's context into its headers (traceparent, baggage: whatever
// p injects) and passes the request on to next. Put it under a guarded
// client (as the transport guardhttp wraps): each attempt's request then
// carries the attempt span, so the server's spans hang under the attempt
// that reached it. A nil next means http.DefaultTransport; a nil p means
// otel.GetTextMapPropagator() at the time of each request.
//
// Like every RoundTripper it does not modify the request it is given: when
// there is something to inject it sends a clone. It is safe for concurrent
// use if next is.
func Transport(next http.RoundTripper, p propagation.TextMapPropagator) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return &transport{next: next, p: p}
}

type transport struct {
	next http.RoundTripper
	p    propagation.TextMapPropagator
}

// RoundTrip sends req, or a clone of it carrying the trace context, to next.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	p := t.p
	if p == nil {
		p = gotel.GetTextMapPropagator()
	}
	h := make(http.Header)
	p.Inject(req.Context(), propagation.HeaderCarrier(h))
	if len(h) == 0 {
		return t.next.RoundTrip(req)
	}
	out := req.Clone(req.Context())
	for k, v := range h {
		out.Header[k] = v
	}
	return t.next.RoundTrip(out)
}

// Middleware returns an http.Handler that reads the caller's trace context
// from the request headers with Config.Propagator and serves the request
// with it in its context, so the spans of guarded calls the handler makes
// (and shedding or idempotency events) join the caller's trace. It starts
// no span of its own: use an HTTP server instrumentation for that, in which
// case it is not needed. Its method value composes with the other
// server-side pieces: r.Use(tracing.Middleware, sh.Middleware).
func (o *Observer) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		prop := o.prop
		if prop == nil {
			prop = gotel.GetTextMapPropagator()
		}
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}
