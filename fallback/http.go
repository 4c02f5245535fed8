package fallback

import "net/http"

// HeaderPartial marks a partial response: "true" when optional parts are
// missing.
const HeaderPartial = "X-Partial"

// MarkPartial marks a response as partial: X-Partial: true and
// Cache-Control: no-store, replacing any Cache-Control the handler set for
// complete responses. Call it before writing the header.
//
// Why no-store: a cache that keeps a partial response serves it as if it
// were complete, to everyone, after the missing dependency has recovered.
// The next request should reach the server and
// get the complete answer; under overload the shedder, not a cache of
// degraded answers, is what protects the server.
func MarkPartial(h http.Header) {
	h.Set(HeaderPartial, "true")
	h.Set("Cache-Control", "no-store")
}
