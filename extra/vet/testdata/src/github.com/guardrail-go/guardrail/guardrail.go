// Package guardrail is a stub of the real package for the analyzers' tests.
package guardrail

import (
	"context"
	"time"
)

type Policy struct {
	Name           string
	MaxAttempts    int
	AttemptTimeout time.Duration
	Idempotent     bool
}

type Call struct{ Idempotent bool }

func Do[T any](ctx context.Context, p *Policy, op func(context.Context) (T, error)) (T, error) {
	return op(ctx)
}

func DoCall[T any](ctx context.Context, p *Policy, c Call, op func(context.Context) (T, error)) (T, error) {
	return op(ctx)
}
