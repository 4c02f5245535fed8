package guardgrpc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

// An UNAVAILABLE that reached the server without a pushback may be an
// answer lost after the handler ran: for a method that is not idempotent
// the call ends with ErrOutcomeUnknown, as guardhttp's does for a reset
// connection, and is not retried. A pushback is the server saying when to
// come back: an answer, not a loss.
func TestUnavailableAfterSendIsOutcomeUnknown(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pushback string
		unknown  bool
	}{
		{"no pushback", "", true},
		{"pushback", "100", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &health{check: func(ctx context.Context, _ int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
				if tc.pushback != "" {
					grpc.SetTrailer(ctx, metadata.Pairs(guardgrpc.MDPushback, tc.pushback))
				}
				return nil, status.Error(codes.Unavailable, "the handler ran; its answer is lost")
			}}
			cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{MaxAttempts: 3}}))
			_, err := cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
			if got := errors.Is(err, guardrail.ErrOutcomeUnknown); got != tc.unknown {
				t.Errorf("err = %v; Is ErrOutcomeUnknown %v, want %v", err, got, tc.unknown)
			}
			if status.Code(err) != codes.Unavailable {
				t.Errorf("code %v, want the server's UNAVAILABLE", status.Code(err))
			}
			if n := h.calls.Load(); n != 1 {
				t.Errorf("the handler ran %d times; a call that is not idempotent and may have run must not be sent again", n)
			}
		})
	}
}
