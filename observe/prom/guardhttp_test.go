package prom_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/observe/prom"
)

// 10,000 distinct paths through guardhttp produce a bounded number of
// series: the transport labels by host, never by raw path.
func TestCardinalityThroughGuardHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path[len(r.URL.Path)-1] == '7' {
			w.WriteHeader(http.StatusServiceUnavailable) // some retries too
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	reg := prometheus.NewPedanticRegistry()
	c := prom.New(prom.Config{})
	reg.MustRegister(c)
	tr, err := guardhttp.NewTransport(srv.Client().Transport, guardhttp.Config{Name: "users", Observer: c, MaxAttempts: 2, Backoff: backoff.None()})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()

	count := func() int {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range families {
			n += len(f.GetMetric())
		}
		return n
	}
	get := func(from, to int) {
		for i := from; i < to; i++ {
			resp, err := client.Get(fmt.Sprintf("%s/users/%d?session=%d", srv.URL, i, i))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	get(0, 1000)
	after1k := count()
	get(1000, 10_000)
	after10k := count()
	if after10k != after1k {
		t.Fatalf("%d series after 1,000 distinct paths, %d after 10,000: the paths leak into labels", after1k, after10k)
	}
	if after10k > 200 {
		t.Fatalf("%d series for one host", after10k)
	}
	t.Logf("%d series after 10,000 distinct paths", after10k)
}

func TestGuardHTTPEventsAreCounted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer srv.Close()
	reg := prometheus.NewPedanticRegistry()
	c := prom.New(prom.Config{})
	reg.MustRegister(c)
	tr, err := guardhttp.NewTransport(srv.Client().Transport, guardhttp.Config{Name: "users", Observer: c})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	for i := range 5 {
		resp, err := (&http.Client{Transport: tr}).Get(fmt.Sprintf("%s/u/%d", srv.URL, i))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	calls := only(samples(t, reg), "guardrail_calls_total")
	total := 0.0
	for k, v := range calls {
		total += v
		if !strings.Contains(k, `dependency="users"`) {
			t.Errorf("series %s: want Config.Name as the dependency", k)
		}
	}
	if total != 5 {
		t.Fatalf("calls counted %v (%v), want 5", total, calls)
	}
}
