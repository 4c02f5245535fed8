package guardgrpc

import (
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

func TestReplyCopies(t *testing.T) {
	t.Run("proto message", func(t *testing.T) {
		dst := &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}
		src := newReply(dst).(*healthpb.HealthCheckResponse)
		if src == dst || src.Status != healthpb.HealthCheckResponse_UNKNOWN {
			t.Fatalf("newReply = %v, want a fresh empty message", src)
		}
		src.Status = healthpb.HealthCheckResponse_SERVING
		copyReply(dst, src)
		if !proto.Equal(dst, src) {
			t.Fatalf("copy %v, want %v", dst, src)
		}
	})
	t.Run("other pointer", func(t *testing.T) {
		type reply struct {
			N    int
			Tags []string
		}
		dst := &reply{N: 1}
		src := newReply(dst).(*reply)
		if src == dst || src.N != 0 {
			t.Fatalf("newReply = %+v, want a fresh zero value", src)
		}
		src.N, src.Tags = 2, []string{"a"}
		copyReply(dst, src)
		if dst.N != 2 || len(dst.Tags) != 1 {
			t.Fatalf("copy %+v, want %+v", dst, src)
		}
	})
	for _, r := range []any{nil, 3, struct{}{}, (*healthpb.HealthCheckResponse)(nil)} {
		if duplicable(r) {
			t.Errorf("duplicable(%#v) = true, want false: no reply of its own can be made", r)
		}
	}
}
