package guardgrpc_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/metastable"
	"github.com/guardrail-go/guardrail/shed"
)

// A metastability detector on a guardgrpc client sees its calls as it
// sees a Policy's: the calls, their outcome, their attempts and retries,
// under the client's Name; and its actuator drains the budget the client shares
// and relieves the server's shedder, whose pushback follows.
func TestMetastableDetectorOnGRPC(t *testing.T) {
	b, err := budget.New(budget.Config{Ratio: 1, Max: 1000}) // every call may retry: the retries show
	if err != nil {
		t.Fatal(err)
	}
	sh, err := shed.New(shed.Config{Name: "front", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	d, err := metastable.New(metastable.Config{Name: "health", Hold: 1, MinCalls: 10,
		Relief: metastable.Relief{Act: true, Budgets: []*budget.Budget{b}, Shedders: []*shed.Shedder{sh}}})
	if err != nil {
		t.Fatal(err)
	}
	h := &health{check: func(_ context.Context, n int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if n%3 != 0 { // two of three attempts fail: one call in three succeeds at its first try
			return nil, status.Error(codes.DeadlineExceeded, "too slow")
		}
		return serving, nil
	}}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{Name: "health", Observer: d,
		IdempotentMethods: []string{checkMethod},
		Retry:             guardrail.Retry{MaxAttempts: 2, Budget: b, Backoff: backoff.None()}}))
	for range 30 {
		_, _ = cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	}
	w := d.Evaluate(context.Background())
	// The client's breaker opens on the way and refuses some calls before
	// any attempt: every call counts, every attempt the server saw too.
	if w.Calls != 30 || w.Retries == 0 {
		t.Fatalf("window %+v; want the 30 calls and their retries", w)
	}
	if served := h.calls.Load(); served != w.Attempts || served/3 != w.OK {
		t.Fatalf("the server saw %d attempts (%d answered), the detector %d attempts, %d calls ok", served, served/3, w.Attempts, w.OK)
	}
	if w.State != metastable.Metastable || !w.Acting {
		t.Fatalf("window %+v; want metastable (goodput %.2f, %.2f retries per call), acting", w, w.Goodput(), w.RetryRatio())
	}
	if b.Tokens() != 0 || sh.Stats().Limit != 50 {
		t.Fatalf("budget %v tokens, shed limit %d; want drained and cut to 50", b.Tokens(), sh.Stats().Limit)
	}
}
