package fault

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The cost of the middleware on a request that gets no fault, against the
// bare handler: what an Injector left in front of a service costs.
func BenchmarkMiddleware(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	miss := func(n int) []Rule {
		rules := make([]Rule, n)
		for i := range rules {
			rules[i] = Rule{Name: fmt.Sprint("r", i), Match: Match{Methods: []string{"POST"}, Path: "/orders/**"},
				Fault: Status{}}
		}
		return rules
	}
	cases := []struct {
		name  string
		rules []Rule
	}{
		{"no-rules", nil},
		{"1-rule-path-miss", []Rule{{Match: Match{Path: "/orders/**"}, Fault: Status{}}}},
		{"10-rules-miss", miss(10)},
		{"1-rule-p0.001", []Rule{{Probability: 0.001, Fault: Status{}}}},
	}
	req := httptest.NewRequest("GET", "/users/42", nil)
	w := httptest.NewRecorder()
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			handler.ServeHTTP(w, req)
		}
	})
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			in := mustNew(b, Config{Rules: c.rules, Rand: NewRand(1)})
			h := in.Middleware(handler)
			b.ReportAllocs()
			for b.Loop() {
				h.ServeHTTP(w, req)
			}
		})
	}
}

// The same for the client side, with a base transport that does nothing.
func BenchmarkTransport(b *testing.B) {
	resp := &http.Response{StatusCode: 200, Body: http.NoBody}
	base := roundTripFunc(func(*http.Request) (*http.Response, error) { return resp, nil })
	req := httptest.NewRequest("GET", "http://dep.test/users/42", nil)
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = base.RoundTrip(req)
		}
	})
	b.Run("1-rule-host-miss", func(b *testing.B) {
		in := mustNew(b, Config{Rules: []Rule{{Match: Match{Host: "pricing.*"}, Fault: Refuse{}}}})
		tr := in.Transport(base)
		b.ReportAllocs()
		for b.Loop() {
			_, _ = tr.RoundTrip(req)
		}
	})
}
