package guardhttp_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/guardhttp"
)

// plainTransport is the pool NewClient builds, without the guard, so that
// the comparison measures the guard alone.
func plainTransport() *http.Transport {
	d := &net.Dialer{Timeout: guardhttp.DefaultConnectTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4 * guardhttp.DefaultMaxIdleConnsPerHost,
		MaxIdleConnsPerHost:   guardhttp.DefaultMaxIdleConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   guardhttp.DefaultTLSHandshakeTimeout,
		ExpectContinueTimeout: time.Second,
	}
}

// BenchmarkClient compares a plain http.Client with guardhttp.NewClient on
// the same loopback server, in one run: the success path of a GET.
func BenchmarkClient(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	clients := []struct {
		name   string
		client *http.Client
	}{
		{"plain", &http.Client{Transport: plainTransport()}},
		{"guardhttp", guardhttp.NewClient(guardhttp.Config{})},
	}
	for _, deadline := range []bool{false, true} {
		for _, c := range clients {
			name := c.name
			if deadline {
				name += "/deadline"
			}
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				if deadline {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Hour)
					defer cancel()
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					resp, err := c.client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
	}
	for _, c := range clients {
		c.client.CloseIdleConnections()
	}
}
