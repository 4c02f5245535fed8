package guardhttp_test

import (
	"io"
	"math"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// onlyReader hides a body's type, so the request gets no GetBody and the
// Transport has to buffer it to send it again.
type onlyReader struct{ io.Reader }

// TestNoBufferLimitKeepsTheBody: MaxBufferedBody at math.MaxInt64 keeps the
// whole body and sends it on every attempt. (max+1 used to wrap negative,
// so the body was read as empty and a PUT arrived with none.)
func TestNoBufferLimitKeepsTheBody(t *testing.T) {
	var bodies []string
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(b))
		if len(bodies) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	c := newClient(t, guardhttp.Config{MaxBufferedBody: math.MaxInt64,
		Retry: guardrail.Retry{Backoff: backoff.None(), Budget: budget.Unlimited()}})
	req, _ := http.NewRequest(http.MethodPut, srv.URL, onlyReader{strings.NewReader(`{"name":"x"}`)})
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if len(bodies) != 2 || bodies[0] != `{"name":"x"}` || bodies[1] != bodies[0] {
		t.Errorf("the server saw %q; want the body twice", bodies)
	}
}

// TestDeclaredLengthIsNotAllocated: a body that declares 8 GiB and holds
// 4 bytes costs what it holds, not what it declares.
func TestDeclaredLengthIsNotAllocated(t *testing.T) {
	tr, err := guardhttp.NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	}), guardhttp.Config{MaxBufferedBody: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPut, "http://example.test/", onlyReader{strings.NewReader("abcd")})
	req.ContentLength = 8 << 30
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resp, err := tr.RoundTrip(req)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Errorf("one request allocated %d bytes for a 4-byte body declared at 8 GiB", grew)
	}
}
