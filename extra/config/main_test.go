package config

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("os/signal.signal_recv"), goleak.IgnoreTopFunction("os/signal.loop"))
}

// do runs op as the caller of a policy dependency does: bounded by the
// dependency's deadline, under the policy in force.
func do[T any](ctx context.Context, h *PolicyHandle, op func(context.Context) (T, error)) (T, error) {
	ctx, cancel := h.WithDeadline(ctx)
	defer cancel()
	return guardrail.Do(ctx, h.Policy(), op)
}

// doHedged is do for an operation written to be hedged.
func doHedged[T any](ctx context.Context, h *PolicyHandle, c guardrail.Call, op func(context.Context) (T, error)) (T, error) {
	ctx, cancel := h.WithDeadline(ctx)
	defer cancel()
	return guardrail.DoHedged(ctx, h.Policy(), c, op)
}
