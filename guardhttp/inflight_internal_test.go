package guardhttp

import (
	"net/http"
	"testing"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
)

// inFlight reads a peer's Retry-After: whatever it holds, it never panics,
// never yields a negative delay, and makes a 409 retryable only for a
// request with a key and a Retry-After the parser accepts.
func FuzzInFlight(f *testing.F) {
	for _, v := range []string{"1", "0", "-1", "1.5", "", " 3 ", "99999999999999999999", "9223372036854775807",
		"Sun, 06 Nov 1994 08:49:37 GMT", "Fri, 31 Dec 9999 23:59:59 GMT", "garbage", "1, 2"} {
		f.Add(v, true)
		f.Add(v, false)
	}
	f.Fuzz(func(t *testing.T, ra string, key bool) {
		req, _ := http.NewRequest(http.MethodPost, "http://svc/", nil)
		if key {
			req.Header.Set("Idempotency-Key", "k")
		}
		resp := &http.Response{StatusCode: http.StatusConflict, Header: http.Header{"Retry-After": {ra}}, Request: req}
		v := DefaultClassify(resp, nil)
		inFlight(req, resp, &v)
		_, valid := retryAfter(resp)
		switch {
		case v.RetryAfter < 0:
			t.Fatalf("negative delay %v", v.RetryAfter)
		case v.InFlight && (!key || !valid):
			t.Fatalf("in flight without a key (%v) or a valid Retry-After %q", key, ra)
		case !v.InFlight && key && valid:
			t.Fatalf("keyed 409 with Retry-After %q not in flight", ra)
		case v.InFlight && v.Outcome != breaker.Ignored:
			t.Fatalf("in-flight outcome %v, want ignored", v.Outcome)
		case !v.InFlight && v != (guardrail.Verdict{Outcome: breaker.Ignored}):
			t.Fatalf("a final 409 got %+v", v)
		}
	})
}
