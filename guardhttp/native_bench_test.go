package guardhttp

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// answerAtOnce is a base transport that answers every request at once with
// a two-byte body.
type answerAtOnce struct{}

func (answerAtOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
}

// BenchmarkNativeOverhead is the guard's own cost per request on the
// native path (see native.go), with no network: engine, breaker, budget,
// the attempt and its body's registration with the watchdog. The
// connection's part (phases, header scan) needs a connection: see
// BenchmarkHeaderScan and BenchmarkClientPaired. Compare with rt=bare.
func BenchmarkNativeOverhead(b *testing.B) {
	native := NewTransport(answerAtOnce{}, Config{})
	native.native = true
	req, err := http.NewRequest(http.MethodGet, "http://example.test/", nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"bare", answerAtOnce{}},
		{"native", native},
	} {
		b.Run("rt="+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, err := c.rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
