package prom_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/guardrail-go/guardrail/event"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/extra/prom"
)

func Example() {
	metrics, err := prom.New(prom.Config{})
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	reg.MustRegister(metrics)

	p := &guardrail.Policy{Name: "pricing", Idempotent: true, Retry: guardrail.Retry{Backoff: backoff.None()}, Observer: metrics}
	metrics.WatchPolicy(p) // export its breaker and retry budget from the first scrape

	ctx := event.WithOperation(context.Background(), "GetPrice")
	calls := 0
	_, _ = guardrail.Do(ctx, p, func(context.Context) (int, error) {
		calls++
		if calls == 1 {
			return 0, guardrail.Transient(errors.New("503 from pricing"))
		}
		return 100, nil
	})

	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetType() == dto.MetricType_HISTOGRAM { // not shown in this example
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				if l.GetValue() == "" { // to PromQL, an empty label is no label
					continue
				}
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			fmt.Printf("%s{%s} %v\n", f.GetName(), strings.Join(labels, ","), m.GetCounter().GetValue()+m.GetGauge().GetValue())
		}
	}
	// Output:
	// guardrail_attempts_total{dependency=pricing,operation=GetPrice,outcome=failure} 1
	// guardrail_attempts_total{dependency=pricing,operation=GetPrice,outcome=success} 1
	// guardrail_breaker_state{dependency=pricing,state=closed} 1
	// guardrail_breaker_state{dependency=pricing,state=half_open} 0
	// guardrail_breaker_state{dependency=pricing,state=open} 0
	// guardrail_calls_total{dependency=pricing,operation=GetPrice,outcome=ok} 1
	// guardrail_retries_total{dependency=pricing,operation=GetPrice,reason=backoff} 1
	// guardrail_retry_budget_tokens{dependency=pricing} 9
	// guardrail_retry_success_total{dependency=pricing,operation=GetPrice} 1
}

// A guardhttp client named "users" keeps one breaker per host. Watching its
// group under the client's name exports each breaker under the dependency
// its calls report, with the host as the key, so calls, transitions and
// state join on dependency.
func ExampleCollector_WatchBreakerGroup() {
	metrics, err := prom.New(prom.Config{})
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)

	hosts, err := breaker.NewGroup(breaker.GroupConfig{}) // in a client: transport.Breakers()
	if err != nil {
		panic(err)
	}
	metrics.WatchBreakerGroup("users", hosts)
	hosts.Get("10.0.0.7:443")
	hosts.Get("10.0.0.8:443").ForceOpen()

	families, _ := reg.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetGauge().GetValue() == 1 { // each breaker's current state
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				fmt.Printf("%s{%s}\n", f.GetName(), strings.Join(labels, ","))
			}
		}
	}
	// Output:
	// guardrail_breaker_state{dependency=users,key=10.0.0.7:443,state=closed}
	// guardrail_breaker_state{dependency=users,key=10.0.0.8:443,state=open}
}

// dependencies is a Source as a config.Registry is one: what the values
// in force use, read at every scrape.
type dependencies struct {
	hosts  *breaker.Group
	ledger *breaker.Breaker
}

func (d dependencies) RangeBreakers(yield func(dependency, key string, b *breaker.Breaker) bool) {
	d.hosts.Range(func(key string, b *breaker.Breaker) bool { return yield("payments", key, b) })
	yield("ledger", "", d.ledger)
}

func (d dependencies) RangeBudgets(func(dependency string, b *budget.Budget) bool) {}

// The breakers of a policy file's clients, watched through the Registry
// (metrics.WatchSource(reg)): each exported with its dependency and key
// from the moment it exists, before any transition.
func ExampleCollector_WatchSource() {
	metrics, err := prom.New(prom.Config{})
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)

	hosts, _ := breaker.NewGroup(breaker.GroupConfig{})
	ledger, _ := breaker.New(breaker.Config{})
	metrics.WatchSource(dependencies{hosts, ledger})
	hosts.Get("pay.example:443") // the first call to a host makes its breaker

	families, _ := reg.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetGauge().GetValue() == 1 {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				fmt.Printf("%s{%s}\n", f.GetName(), strings.Join(labels, ","))
			}
		}
	}
	// Output:
	// guardrail_breaker_state{dependency=ledger,key=,state=closed}
	// guardrail_breaker_state{dependency=payments,key=pay.example:443,state=closed}
}
