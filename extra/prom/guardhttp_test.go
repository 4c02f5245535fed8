package prom_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/extra/prom"
	"github.com/guardrail-go/guardrail/guardhttp"
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
	c := newCollector(t, prom.Config{})
	reg.MustRegister(c)
	tr, err := guardhttp.NewTransport(srv.Client().Transport, guardhttp.Config{Name: "users", Observer: c, Retry: guardrail.Retry{MaxAttempts: 2, Backoff: backoff.None()}})
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
	c := newCollector(t, prom.Config{})
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

// TestGuardHTTPOneDependencyPerBreaker: a named client's breaker is one
// guardrail_breaker_state series under the client's name, with the host as
// its key, whether its state comes from the watched group or from the
// transition the transport reports; calls, transitions and the state join
// on dependency.
func TestGuardHTTPOneDependencyPerBreaker(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	reg := prometheus.NewPedanticRegistry()
	c := newCollector(t, prom.Config{})
	reg.MustRegister(c)
	tr, err := guardhttp.NewTransport(srv.Client().Transport, guardhttp.Config{Name: "users", Observer: c})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	c.WatchBreakerGroup("users", tr.Breakers())
	client := &http.Client{Transport: tr}

	resp, err := client.Get(srv.URL + "/u/1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tr.Breakers().Get(host).ForceOpen() // the transport reports the transition under "users"
	if _, err := client.Get(srv.URL + "/u/2"); !errors.Is(err, guardrail.ErrCircuitOpen) {
		t.Fatalf("call on the open breaker: %v, want ErrCircuitOpen", err)
	}

	got := samples(t, reg)
	diff(t, only(got, "guardrail_breaker_state", "guardrail_breaker_transitions_total", "guardrail_calls_total"), map[string]float64{
		`guardrail_breaker_state{dependency="users",key="` + host + `",state="closed"}`:                        0,
		`guardrail_breaker_state{dependency="users",key="` + host + `",state="open"}`:                          1,
		`guardrail_breaker_state{dependency="users",key="` + host + `",state="half_open"}`:                     0,
		`guardrail_breaker_transitions_total{dependency="users",from="closed",reason="forced_open",to="open"}`: 1,
		`guardrail_calls_total{dependency="users",operation="",outcome="ok"}`:                                  1,
		`guardrail_calls_total{dependency="users",operation="",outcome="circuit_open"}`:                        1,
	})
}
