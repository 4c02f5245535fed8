package grpcconfig

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/guardrail-go/guardrail/extra/config"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

const benchFile = `
dependencies:
  dep:
    kind: grpc
    reason: "bench"
    idempotent_methods: [/bench.Service/]
`

// BenchmarkUnaryInterceptor compares a unary call that succeeds at once
// through the Client of a policy file with one through the
// guardgrpc.Client built by hand from the same settings: the difference
// is the cost of following reloads. The invoker does nothing, so the
// numbers are the interceptors' alone.
func BenchmarkUnaryInterceptor(b *testing.B) {
	reg, err := config.New("policy.yaml", []byte(benchFile), config.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	fromFile, err := NewClient(reg, "dep", Options{})
	if err != nil {
		b.Fatal(err)
	}
	h, _ := reg.GRPC("dep")
	hand := ClientConfig(h.Current(), Options{})
	hand.ConnRetriesDisabled = true
	byHand, err := guardgrpc.NewClient(hand)
	if err != nil {
		b.Fatal(err)
	}
	cc, err := grpc.NewClient("passthrough:///bench", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		run  grpc.UnaryClientInterceptor
	}{
		{"via=guardgrpc", byHand.UnaryClientInterceptor()},
		{"via=grpcconfig", fromFile.unary},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := bc.run(ctx, "/bench.Service/Get", nil, nil, cc, invoker); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
