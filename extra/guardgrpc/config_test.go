package guardgrpc_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/shed"
)

// TestConfigsNameEveryInvalidField: NewClient and NewServer report every
// invalid field at once, each Is ErrInvalidConfig.
func TestConfigsNameEveryInvalidField(t *testing.T) {
	_, err := guardgrpc.NewClient(guardgrpc.ClientConfig{
		Retry:             guardrail.Retry{MaxAttempts: -1, AttemptTimeout: -1},
		IdempotentMethods: []string{"pkg.Service/Get"},
		Bulkhead:          &bulkhead.Config{MaxConcurrent: -1},
	})
	wantAll(t, "NewClient", err, "ClientConfig.MaxAttempts", "ClientConfig.AttemptTimeout", "ClientConfig.IdempotentMethods", "ClientConfig.Bulkhead")
	_, err = guardgrpc.NewServer(guardgrpc.ServerConfig{ShedCode: codes.Internal, MaxPriority: shed.Critical + 1})
	wantAll(t, "NewServer", err, "ServerConfig.ShedCode", "ServerConfig.MaxPriority")
}

func wantAll(t *testing.T, what string, err error, fields ...string) {
	t.Helper()
	if !errors.Is(err, guardgrpc.ErrInvalidConfig) {
		t.Fatalf("%s: %v; want ErrInvalidConfig", what, err)
	}
	for _, f := range fields {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("%s: %q does not name %s", what, err, f)
		}
	}
}
