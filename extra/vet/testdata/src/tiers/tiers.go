package tiers

import (
	"context"
	"net/http"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/guardhttp"
)

func nested(ctx context.Context) {
	outer, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	inner, cancel2 := context.WithTimeout(outer, 5*time.Second) // want `\[tiers\] context.WithTimeout of 5s under a context with at most 2s`
	defer cancel2()
	shorter, cancel3 := context.WithTimeout(inner, time.Second) // shorter: fine
	defer cancel3()
	_ = shorter
	valued := context.WithValue(outer, key{}, 1)
	_, cancel4 := context.WithTimeout(valued, 3*time.Second) // want `3s under a context with at most 2s`
	defer cancel4()
	_, cancel5 := context.WithTimeout(ctx, time.Hour) // the caller's budget is not visible: fine
	defer cancel5()
}

type key struct{}

var policy = &guardrail.Policy{Name: "users", AttemptTimeout: time.Second}

func attempts(ctx context.Context, req *http.Request) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	guardrail.Do(ctx, policy, func(ctx context.Context) (int, error) { return 0, nil }) // want `Policy.AttemptTimeout 1s is longer than the 500ms its context has`
}

func clients(ctx context.Context, req *http.Request) {
	slow := &http.Client{Timeout: 30 * time.Second}
	quick := &http.Client{Timeout: 800 * time.Millisecond}
	gc, _ := guardhttp.NewClient(guardhttp.Config{MaxAttempts: 1, AttemptTimeout: 5 * time.Second})
	guardrail.Do(ctx, policy, func(ctx context.Context) (*http.Response, error) {
		quick.Do(req)       // shorter than the attempt: fine
		gc.Do(req)          // want `guardhttp Config.AttemptTimeout 5s is longer than the Policy's AttemptTimeout 1s`
		return slow.Do(req) // want `http.Client.Timeout 30s is longer than the Policy's AttemptTimeout 1s around it`
	})
}
