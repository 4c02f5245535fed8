package guardgrpc_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/shed"
)

// A relieved shedder's longer Retry-After is the pushback of the calls
// the server sheds meanwhile, and the configured one comes back after.
func TestReliefPushback(t *testing.T) {
	sh, err := shed.New(shed.Config{Name: "front", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, &health{}, newServer(t, guardgrpc.ServerConfig{Shedder: sh, ShedPushback: 250 * time.Millisecond}).ServerOptions()...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := healthpb.NewHealthClient(conn)
	tok, err := sh.Acquire(context.Background(), shed.Normal) // the one slot
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Release()
	pushback := func() string {
		var trailer metadata.MD
		_, err := client.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("call with the slot held: %v; want UNAVAILABLE", err)
		}
		return trailer.Get(guardgrpc.MDPushback)[0]
	}
	if got := pushback(); got != "250" {
		t.Fatalf("pushback %q; want the configured 250", got)
	}
	sh.Relieve(0.5, 20*time.Second)
	if got := pushback(); got != "20000" {
		t.Fatalf("pushback while relieved %q; want 20000", got)
	}
	sh.Relieve(0, 0)
	if got := pushback(); got != "250" {
		t.Fatalf("pushback after the relief %q; want 250", got)
	}
}
