package grpcconfig_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/extra/grpcconfig"
)

// reloadFile is testFile with a breaker per target, a bulkhead wide enough
// for every caller of the test, and a run of failures that never trips.
var reloadFile = strings.NewReplacer(
	"    failure_domain: method\n", "",
	"bulkhead: {max_concurrent: 20}", "bulkhead: {max_concurrent: 500}",
	"consecutive_failures: 4", "consecutive_failures: 1000",
).Replace(testFile)

// A reload under concurrent callers on a real connection loses no call,
// reaches the calls that start after it, and keeps the breakers, budget
// and bulkhead compartments whose settings did not change.
func TestReloadUnderConcurrentCallers(t *testing.T) {
	reg := newRegistry(t, reloadFile)
	c, err := grpcconfig.NewClient(reg, "health", grpcconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &health{}
	addr := serve(t, h)
	cl := dial(t, addr, c.DialOptions())
	before := c.Current()

	const callers, calls = 50, 20
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	ctx := ctxTimeout(t, time.Minute)
	for range callers {
		wg.Go(func() {
			<-start
			for range calls {
				if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	close(start)
	// Reload while the callers run, at least 10 times: the attempt
	// timeout changes (a new guardgrpc.Client), the breaker, budget and
	// bulkhead settings do not; every fifth file is broken.
	applied, rejected := 0, 0
	var last time.Duration
	running := func() bool {
		select {
		case <-finished:
			return false
		default:
			return true
		}
	}
	for i := 0; i < 10 || running(); i++ {
		timeout := time.Duration(2+i%2) * time.Second
		data := strings.Replace(reloadFile, "attempt_timeout: 2s", fmt.Sprintf("attempt_timeout: %v", timeout), 1)
		bad := i%5 == 4
		if bad {
			data = strings.Replace(data, "max_attempts: 3", "max_attempts: three", 1)
		}
		err := reg.ReloadBytes([]byte(data))
		switch {
		case (err != nil) != bad:
			t.Fatalf("reload %d: %v", i, err)
		case bad:
			rejected++
		default:
			applied++
			last = timeout
		}
	}
	<-finished
	t.Logf("%d reloads applied and %d rejected under %d callers", applied, rejected, callers)
	if n := failed.Load(); n != 0 {
		t.Errorf("%d calls failed across the reloads; want none", n)
	}
	if n := h.calls.Load(); n != callers*calls {
		t.Errorf("the server saw %d calls; want %d", n, callers*calls)
	}
	after := c.Current()
	if after == before {
		t.Error("new attempt timeouts kept the old guardgrpc.Client")
	}
	if after.Breakers() != before.Breakers() || after.RetryBudget() != before.RetryBudget() || after.Bulkheads() != before.Bulkheads() || after.Bulkheads() == nil {
		t.Error("a reload that left the breaker, budget and bulkhead settings alone replaced them")
	}
	if cfg, _ := c.Config(); cfg.AttemptTimeout != last {
		t.Errorf("attempt timeout %v after the last reload; want %v", cfg.AttemptTimeout, last)
	}
	if st := reg.Stats(); st.Applied != uint64(applied) || st.Rejected != uint64(rejected) {
		t.Errorf("stats %+v; want %d applied, %d rejected", st, applied, rejected)
	}
}

// New settings reach the next call; a breaker forced open and a spent
// budget survive reloads that leave their own settings alone, and start
// afresh when those change.
func TestReloadKeepsBreakerAndBudget(t *testing.T) {
	reg := newRegistry(t, reloadFile)
	c, err := grpcconfig.NewClient(reg, "health", grpcconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &health{}
	h.script(unavailable)
	addr := serve(t, h)
	cl := dial(t, addr, c.DialOptions())
	call := func() (int64, error) {
		t.Helper()
		n := h.calls.Load()
		_, err := cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
		return h.calls.Load() - n, err
	}
	reload := func(old, new string) {
		t.Helper()
		if err := reg.ReloadBytes([]byte(strings.Replace(reloadFile, old, new, 1))); err != nil {
			t.Fatal(err)
		}
	}

	// Attempts follow the file.
	if n, _ := call(); n != 3 {
		t.Fatalf("server saw %d attempts; want 3", n)
	}
	reload("    attempt_timeout: 2s\n", "    attempt_timeout: 2s\n    max_attempts: 1\n")
	if n, _ := call(); n != 1 {
		t.Errorf("after a reload to max_attempts 1 the server saw %d attempts; want 1", n)
	}
	reload("", "")
	if n, _ := call(); n != 3 {
		t.Errorf("after a reload back to 3 attempts the server saw %d; want 3", n)
	}

	// A breaker forced open stays open.
	key := "passthrough:///" + addr
	br := c.Current().Breakers().Get(key)
	br.ForceOpen()
	reload("attempt_timeout: 2s", "attempt_timeout: 3s")
	if n, err := call(); n != 0 || !errors.Is(err, guardrail.ErrCircuitOpen) || status.Code(err) != codes.Unavailable {
		t.Errorf("after an unrelated reload: %d calls sent, %v; want none, refused by the breaker forced open", n, err)
	}
	if got := c.Current().Breakers().Get(key); got != br || got.State() != breaker.Open {
		t.Errorf("the breaker after the reload: same %v, %v; want the same breaker, open", got == br, got.State())
	}
	reload("open_for: 1m", "open_for: 2m")
	if got := c.Current().Breakers().Get(key); got == br || got.State() != breaker.Closed {
		t.Errorf("after a reload of the breaker's settings: same %v, %v; want a new breaker, closed", got == br, got.State())
	}
	if n, _ := call(); n != 3 {
		t.Errorf("through the new breaker the server saw %d attempts; want 3", n)
	}

	// A budget keeps its tokens.
	b := c.Current().RetryBudget()
	tokens := b.Tokens()
	for range 40 {
		b.TryRetry()
	}
	reload("attempt_timeout: 2s", "attempt_timeout: 4s")
	if got := c.Current().RetryBudget(); got != b || got.Tokens() != tokens-40 {
		t.Errorf("after an unrelated reload: same budget %v, %v tokens; want the same budget, %v tokens", got == b, got.Tokens(), tokens-40)
	}
	reload("max: 100}", "max: 50}")
	if got := c.Current().RetryBudget(); got == b || got.Tokens() != 50 {
		t.Errorf("after a reload of the budget: same %v, %v tokens; want a new budget, full at 50", got == b, got.Tokens())
	}
}

// The calls in flight stay counted in their compartment across a reload
// that leaves the bulkhead alone, so a reload never lets more than
// max_concurrent through; new bulkhead settings start new compartments.
func TestReloadKeepsBulkheadInFlight(t *testing.T) {
	file := strings.Replace(reloadFile, "bulkhead: {max_concurrent: 500}", "bulkhead: {max_concurrent: 2}", 1)
	reg := newRegistry(t, file)
	c, err := grpcconfig.NewClient(reg, "health", grpcconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	in := make(chan struct{}, 8)
	h := &health{}
	h.script(func(context.Context, int64) (*healthpb.HealthCheckResponse, error) {
		in <- struct{}{}
		<-gate
		return serving, nil
	})
	cl := dial(t, serve(t, h), c.DialOptions())
	ctx := ctxTimeout(t, time.Minute)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(gate)
	for range 2 {
		wg.Go(func() { cl.Check(ctx, &healthpb.HealthCheckRequest{}) })
	}
	<-in
	<-in
	if err := reg.ReloadBytes([]byte(strings.Replace(file, "attempt_timeout: 2s", "attempt_timeout: 3s", 1))); err != nil {
		t.Fatal(err)
	}
	_, err = cl.Check(ctx, &healthpb.HealthCheckRequest{})
	if !errors.Is(err, guardrail.ErrBulkheadFull) || status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third call after the reload: %v; want ErrBulkheadFull, the two in flight still counted", err)
	}
	if n := h.calls.Load(); n != 2 {
		t.Errorf("the server saw %d calls; want 2", n)
	}
	if err := reg.ReloadBytes([]byte(strings.Replace(file, "max_concurrent: 2", "max_concurrent: 3", 1))); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { cl.Check(ctx, &healthpb.HealthCheckRequest{}) })
	<-in // admitted by the new compartments
}
