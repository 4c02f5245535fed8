package config

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/throttle"
)

// GRPCSettings are the settings of a gRPC dependency: the fields of a
// guardgrpc.ClientConfig of the same names, in types of the guardrail core
// alone, so that this package does not import gRPC and a program that
// does not call a gRPC dependency does not link it. Package
// extra/grpcconfig turns them into a guardgrpc.ClientConfig and
// installs the client on connections.
//
// A GRPCSettings handed out by a Registry is immutable: a reload that
// changes the dependency's settings makes a new one, whose Budget,
// Breakers, Bulkheads and Throttler are the old ones whenever their own
// settings did not change. It is safe to read concurrently.
type GRPCSettings struct {
	// Name is the dependency's name: guardgrpc.ClientConfig.Name.
	Name string
	// Retry is guardgrpc.ClientConfig.Retry. Its Budget is the Registry's
	// (budget.Unlimited() when the file says unlimited), kept across
	// reloads while its settings are; its Backoff is nil for the
	// library's default.
	guardrail.Retry
	IdempotentMethods   []string
	MaxBufferedMessages int
	// ByMethod gives each method of each target a breaker and a bulkhead
	// compartment of its own (guardgrpc.ByMethod: failure_domain: method);
	// false gives each connection target its own, guardgrpc's default.
	ByMethod bool
	// Bulkhead configures each compartment of Bulkheads; nil means no
	// bulkhead.
	Bulkhead *bulkhead.Config
	// Deadline bounds each unary call, every attempt and backoff
	// included; zero means no bound but the caller's context. A stream is
	// bounded by the caller's context alone, as guardgrpc bounds it: it
	// may rightly live long.
	Deadline time.Duration
	// Hedge hedges the unary calls of IdempotentMethods:
	// guardgrpc.ClientConfig.Hedge. Nil means no hedging.
	Hedge *guardrail.HedgeConfig
	// Throttle configures Throttler; nil means no throttling.
	Throttle *throttle.Config

	// The values the Registry keeps across reloads, besides Budget.

	// Breakers holds a breaker per failure domain.
	Breakers *breaker.Group
	// Bulkheads holds a compartment per failure domain, nil when there is
	// no bulkhead.
	Bulkheads *bulkhead.Group
	// Throttler is the dependency's adaptive throttle, shared with every
	// client of it; nil when there is none.
	Throttler *throttle.Throttler
	// Observer is Options.Observer.
	Observer event.Observer
}

// grpcValue is a gRPC dependency's settings in force, and what they were
// built from, which tells a reload whether they changed.
type grpcValue struct {
	s      *GRPCSettings
	origin origin
}

// GRPCHandle is a gRPC dependency's handle: Current returns the
// settings in force, which a reload replaces. Package extra/grpcconfig
// builds a guardgrpc.Client from each value, and a new one when the value
// changes. It is safe for concurrent use.
type GRPCHandle struct {
	cur atomic.Pointer[grpcValue]
}

// Current returns the settings in force. The pointer changes only when a
// reload changes them, so comparing it with the last one seen tells
// whether to rebuild what was built from it.
func (g *GRPCHandle) Current() *GRPCSettings { return g.cur.Load().s }

// GRPC returns the handle of the gRPC dependency name. Package
// extra/grpcconfig's NewClient takes it from here.
func (r *Registry) GRPC(name string) (*GRPCHandle, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.grpcs[name]
	if !ok {
		return nil, r.unknown("gRPC dependency", name)
	}
	return h, nil
}

// methodName reports whether m is a full gRPC method name,
// "/pkg.Service/Method", or with prefix, a service's "/pkg.Service/".
func methodName(m string, prefix bool) bool {
	service, method, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
	return ok && strings.HasPrefix(m, "/") && service != "" && (method != "" || prefix) &&
		!strings.ContainsAny(method, "/") && !strings.ContainsFunc(m, func(r rune) bool { return r <= ' ' || r == 0x7f })
}

// idempotentMethod reports whether the list of idempotent methods covers
// method, as guardgrpc reads it: by name, or by its service's prefix.
func idempotentMethod(list []string, method string) bool {
	i := strings.LastIndexByte(method, '/')
	return slices.Contains(list, method) || (i > 0 && slices.Contains(list, method[:i+1]))
}

// buildGRPC fills r.GRPC and reports what guardgrpc.NewClient would refuse.
func (c *checkedFile) buildGRPC(r *resolvedDep) []Diagnostic {
	var diags []Diagnostic
	g, ok := grpcSettings(r)
	if !ok {
		diags = append(diags, c.diag(severityError, c.where(r.Name, "failure_domain"), "is %q; want target (a breaker and a compartment per connection target, the default) or method (per method of each target)", val(r.Settings.FailureDomain)))
	}
	for i, m := range r.Settings.IdempotentMethods {
		if !methodName(m, true) {
			diags = append(diags, c.diag(severityError, c.where(r.Name, fmt.Sprintf("idempotent_methods[%d]", i)), "is %q; want a full method name such as /pkg.Service/Method, or /pkg.Service/ for every method of the service", m))
		}
	}
	r.GRPC = g
	// guardgrpc runs every call under a guardrail.Policy of these
	// settings, and refuses what it refuses.
	return append(diags, c.checkPolicy(r.Name, g.Retry)...)
}
