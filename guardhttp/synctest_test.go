package guardhttp_test

import (
	"net/http"
	"testing"
	"testing/synctest"

	"github.com/guardrail-go/guardrail/guardhttp"
)

// A Transport used inside a testing/synctest bubble and one used outside
// it share no timers: a timer made in a bubble must not be touched from
// outside it (the runtime stops the program, a fatal error, not a panic),
// and a test suite mixes such tests.
func TestTransportsInAndOutOfABubble(t *testing.T) {
	send := func(t *testing.T) {
		rt, err := guardhttp.NewTransport(fakeTransport{}, guardhttp.Config{})
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequest(http.MethodGet, "http://example.invalid/", nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 { // each attempt arms a phase timer (connect, then response header)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	synctest.Test(t, send)
	send(t)
}
