package config_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/extra/config"
)

func Example() {
	const file = `
defaults:
  max_attempts: 3
  attempt_timeout: 800ms
dependencies:
  payments:
    reason: "The provider answers charges in up to 1.5 s at p99."
    attempt_timeout: 1500ms
  ledger:
    kind: policy
    reason: "Ledger writes carry an id the ledger deduplicates by."
    idempotent: true
servers:
  api:
    deadline: {max: 5s}
    shed: {limit: 100}
`
	reg, err := config.New("policy.yaml", []byte(file), config.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}

	// An HTTP dependency is an *http.Client.
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "paid") }))
	defer backend.Close()
	payments, _ := reg.HTTPClient("payments")
	resp, err := payments.Get(backend.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(body))

	// Any other call runs under a policy.
	ledger, _ := reg.Policy("ledger")
	ctx, cancel := ledger.WithDeadline(context.Background())
	defer cancel()
	n, err := guardrail.Do(ctx, ledger.Policy(), func(context.Context) (int, error) { return 42, nil })
	fmt.Println(n, err)

	// The server side composes as middleware.
	dl, _ := reg.Deadline("api")
	sh, _ := reg.Shedder("api")
	_ = dl.Middleware(sh.Middleware(http.NotFoundHandler()))

	// What differs from the defaults, and why: what guardrail check prints.
	rep, _ := config.Parse("policy.yaml", []byte(file))
	for _, d := range rep.Dependencies {
		for _, diff := range d.Differences {
			fmt.Printf("%s: %s %s (default %s): %s\n", d.Name, diff.Key, diff.Value, diff.Default, d.Reason)
		}
	}
	// Output:
	// paid
	// 42 <nil>
	// ledger: idempotent true (default false): Ledger writes carry an id the ledger deduplicates by.
	// payments: attempt_timeout 1.5s (default 800ms): The provider answers charges in up to 1.5 s at p99.
}

// A file that does not check names the line of every error.
func ExampleParse() {
	_, err := config.Parse("policy.yaml", []byte(`
dependencies:
  payments:
    reason: "slow provider"
    attempt_timeout: 5
    breaker:
      failure_rate: 1.5
`))
	fmt.Println(err)
	// Output:
	// policy.yaml:5: dependencies.payments.attempt_timeout: "5" has no unit; write 5s
	// policy.yaml:7: dependencies.payments.breaker.failure_rate: is 1.5; want a value in (0, 1], or zero for the default (breaker: Config.FailureRate)
}

// A policy dependency with a hedge section hedges the calls the code makes
// with guardrail.DoHedged: an attempt that has not answered after the
// delay gets a second one alongside it, and the first answer wins.
// guardrail.Do never hedges.
func ExamplePolicyHandle() {
	reg, err := config.New("policy.yaml", []byte(`
dependencies:
  search:
    kind: policy
    reason: "Searches are reads; one replica in twenty stalls for seconds, so a hedge after 10 ms cuts that tail."
    idempotent: true
    hedge: {delay: 10ms}
    throttle: {}
`), config.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	search, _ := reg.Policy("search")
	ctx, cancel := search.WithDeadline(context.Background())
	defer cancel()
	var attempts atomic.Int32
	v, err := guardrail.DoHedged(ctx, search.Policy(), guardrail.Call{}, func(ctx context.Context) (string, error) {
		if attempts.Add(1) == 1 {
			<-ctx.Done() // the stalled replica, until the hedge wins
			return "", ctx.Err()
		}
		return "from the hedge", nil
	})
	fmt.Println(v, err, attempts.Load())
	// Output:
	// from the hedge <nil> 2
}
