package fault_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"time"

	"github.com/guardrail-go/guardrail/fault"
)

// A flaky upstream: every request to /flaky gets a 503 with Retry-After.
func Example() {
	in, err := fault.New(fault.Config{
		Rand: fault.NewRand(1),
		Rules: []fault.Rule{{
			Name:  "flaky",
			Match: fault.Match{Path: "/flaky"},
			Fault: fault.Status{Code: 503, RetryAfter: 2 * time.Second},
		}},
	})
	if err != nil {
		panic(err)
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	srv := httptest.NewServer(in.Middleware(app))
	defer srv.Close()
	defer in.Close()

	for _, path := range []string{"/", "/flaky"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Printf("%s %d Retry-After=%q\n", path, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	for _, c := range in.Counters() {
		fmt.Printf("%s: matched %d, fired %d\n", c.Rule, c.Matched, c.Fired)
	}
	// Output:
	// / 200 Retry-After=""
	// /flaky 503 Retry-After="2"
	// flaky: matched 1, fired 1
}

// A client whose dependency looks dead: requests to one host fail as a
// refused connection, without leaving the process.
func ExampleInjector_Transport() {
	in, err := fault.New(fault.Config{Rules: []fault.Rule{{
		Match: fault.Match{Host: "pricing.internal"},
		Fault: fault.Refuse{},
	}}})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: in.Transport(nil)}
	_, err = client.Get("http://pricing.internal/price/42")
	fmt.Println(errors.Is(err, syscall.ECONNREFUSED))
	fmt.Println(err)
	// Output:
	// true
	// Get "http://pricing.internal/price/42": dial tcp pricing.internal:80: connect: connection refused
}

func ExampleParseConfig() {
	cfg, err := fault.ParseConfig([]byte(`{
  "seed": 7,
  "rules": [
    {"name": "slow-reads", "match": {"methods": ["GET"], "path": "/orders/**"},
     "kind": "latency", "p50": "20ms", "p99": "800ms"},
    {"name": "flaky-writes", "probability": 0.05, "match": {"methods": ["POST"]},
     "kind": "lose_response"}
  ]
}`))
	if err != nil {
		panic(err)
	}
	for _, r := range cfg.Rules {
		fmt.Printf("%s %T %v %v\n", r.Name, r.Fault, r.Probability, r.Match.Methods)
	}

	_, err = fault.ParseConfig([]byte(`{"rules": [{"name": "typo", "kind": "error", "status": 200}]}`))
	fmt.Println(err)
	// Output:
	// slow-reads fault.Latency 1 [GET]
	// flaky-writes fault.LoseResponse 0.05 [POST]
	// fault: rule 0 (typo): status: 200 is not an error status (want 400-599)
}

func ExampleParseRule() {
	r, err := fault.ParseRule("error; status=503; retry_after=2s; probability=0.1; path=/api/**")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%T %+v %v %s\n", r.Fault, r.Fault, r.Probability, r.Match.Path)
	// Output:
	// fault.Status {Code:503 RetryAfter:2s RetryAfterDate:false RetryAfterRaw: Body: GRPCCode:} 0.1 /api/**
}

// The admin endpoint on loopback: curl-like requests with a JSON body
// change the rules; what a web page can make a browser send does not.
func ExampleInjector_Admin() {
	in, err := fault.New(fault.Config{})
	if err != nil {
		panic(err)
	}
	defer in.Close()
	admin, err := in.Admin(fault.AdminConfig{Hosts: []string{"ops.internal"}})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(admin)
	defer srv.Close()

	put := func(contentType, origin string) int {
		req, _ := http.NewRequest("PUT", srv.URL+"/rules", strings.NewReader(`{"rules":[{"kind":"hang"}]}`))
		req.Header.Set("Content-Type", contentType)
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	fmt.Println("cross-site text/plain:", put("text/plain", "https://evil.example"))
	fmt.Println("cross-site JSON:", put("application/json", "https://evil.example"))
	fmt.Println("rules:", len(in.Config().Rules))
	fmt.Println("curl with JSON:", put("application/json", ""))
	fmt.Println("rules:", len(in.Config().Rules))

	_, err = in.Admin(fault.AdminConfig{Hosts: []string{"ops.internal/admin"}})
	fmt.Println(err)
	// Output:
	// cross-site text/plain: 415
	// cross-site JSON: 403
	// rules: 0
	// curl with JSON: 200
	// rules: 1
	// fault: invalid config: AdminConfig.Hosts[0] is "ops.internal/admin"; want a host name or host:port
}
