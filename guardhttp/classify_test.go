package guardhttp_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// FuzzDefaultClassify feeds hostile statuses and Retry-After values: the
// classifier never panics, never returns a negative or unbounded delay,
// and retries only the statuses it lists.
func FuzzDefaultClassify(f *testing.F) {
	for _, s := range []struct {
		code int
		ra   string
	}{
		{503, "1"}, {429, "Wed, 21 Oct 2015 07:28:00 GMT"}, {429, ""}, {503, "-5"},
		{503, "1.5"}, {503, "99999999999999999999999"}, {502, "junk"}, {200, "3"},
		{404, "1"}, {0, ""}, {-1, "1"}, {999, "1"}, {429, "Sunday, 06-Nov-94 08:49:37 GMT"},
	} {
		f.Add(s.code, s.ra)
	}
	f.Fuzz(func(t *testing.T, code int, ra string) {
		resp := &http.Response{StatusCode: code, Header: http.Header{}}
		if ra != "" {
			resp.Header.Set("Retry-After", ra)
		}
		v := guardhttp.DefaultClassify(resp, nil)
		if v.RetryAfter < 0 || v.RetryAfter > 24*time.Hour {
			t.Fatalf("status %d, Retry-After %q: delay %v", code, ra, v.RetryAfter)
		}
		retryable := code == 500 || code == 502 || code == 503 || code == 504 || code == 429
		if v.Retryable && !retryable {
			t.Fatalf("status %d is retryable", code)
		}
		if (code < 400) != (v.Outcome == breaker.Success) {
			t.Fatalf("status %d: outcome %v", code, v.Outcome)
		}
		if code == 429 && v.Retryable {
			if _, ok := backoff.ParseRetryAfter(ra, time.Now()); !ok {
				t.Fatalf("429 without a valid Retry-After (%q) is retryable", ra)
			}
		}
	})
}

// A response with two Retry-After fields is read as the longer one: taking
// the first sent the retry after 1 s to a server whose other field asked
// for 2 s.
func TestTwoRetryAfterFieldsTakeTheLonger(t *testing.T) {
	for _, values := range [][]string{{"1", "2"}, {"2", "1"}, {"soon", "2"}} {
		resp := &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}}
		for _, v := range values {
			resp.Header.Add("Retry-After", v)
		}
		if v := guardhttp.DefaultClassify(resp, nil); v.RetryAfter != 2*time.Second {
			t.Errorf("Retry-After %q: RetryAfter %v, want 2s", values, v.RetryAfter)
		}
	}
}
