package guardgrpc_test

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

// inputs is grpc-go's interop TestService whose client-streaming and
// bidirectional calls fail with UNAVAILABLE, before answering, on their
// first failFirst runs.
type inputs struct {
	testpb.UnimplementedTestServiceServer
	failFirst int64
	calls     atomic.Int64
}

// StreamingInputCall reads every message, then fails or answers with the
// total payload size it read.
func (s *inputs) StreamingInputCall(st testpb.TestService_StreamingInputCallServer) error {
	n := s.calls.Add(1)
	total := 0
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		total += len(m.GetPayload().GetBody())
	}
	if n <= s.failFirst {
		return status.Error(codes.Unavailable, "not yet")
	}
	return st.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: int32(total)})
}

// FullDuplexCall reads one message, then fails or echoes every message.
func (s *inputs) FullDuplexCall(st testpb.TestService_FullDuplexCallServer) error {
	n := s.calls.Add(1)
	m, err := st.Recv()
	if err != nil {
		return err
	}
	if n <= s.failFirst {
		return status.Error(codes.Unavailable, "not yet")
	}
	for {
		if err := st.Send(&testpb.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
		if m, err = st.Recv(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

func serveInputs(t *testing.T, s *inputs, c *guardgrpc.Client) testpb.TestServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	testpb.RegisterTestServiceServer(srv, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, c.DialOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return testpb.NewTestServiceClient(conn)
}

func payload(n int) *testpb.StreamingInputCallRequest {
	return &testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: make([]byte, n)}}
}

func TestClientStreamReplayedOnRetry(t *testing.T) {
	s := &inputs{failFirst: 1}
	cl := serveInputs(t, s, newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{"/grpc.testing.TestService/"}}))
	st, err := cl.StreamingInputCall(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 10, 100} {
		if err := st.Send(payload(n)); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		t.Fatalf("CloseAndRecv: %v", err)
	}
	// The second stream got every message again, and its end.
	if got := resp.GetAggregatedPayloadSize(); got != 111 || s.calls.Load() != 2 {
		t.Fatalf("server read %d bytes on call %d, want 111 on the second", got, s.calls.Load())
	}
}

func TestClientStreamOverBufferNotRetried(t *testing.T) {
	s := &inputs{failFirst: 1}
	cl := serveInputs(t, s, newClient(t, guardgrpc.ClientConfig{
		IdempotentMethods: []string{"/grpc.testing.TestService/"}, MaxBufferedMessages: 2}))
	st, err := cl.StreamingInputCall(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		st.Send(payload(1))
	}
	if _, err := st.CloseAndRecv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("CloseAndRecv: %v, want UNAVAILABLE (three messages do not fit a buffer of two)", err)
	}
	if got := s.calls.Load(); got != 1 {
		t.Fatalf("server saw %d calls, want 1", got)
	}
}

func TestBidiStreamRetriedBeforeFirstMessage(t *testing.T) {
	s := &inputs{failFirst: 2}
	cl := serveInputs(t, s, newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{"/grpc.testing.TestService/FullDuplexCall"}}))
	st, err := cl.FullDuplexCall(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	req := &testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("hi")}}
	if err := st.Send(req); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil || string(m.GetPayload().GetBody()) != "hi" {
		t.Fatalf("Recv: %v, %v; want the echo", m, err)
	}
	// Committed: later messages go to the third stream, which echoes them.
	if err := st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("again")}}); err != nil {
		t.Fatal(err)
	}
	if m, err = st.Recv(); err != nil || string(m.GetPayload().GetBody()) != "again" {
		t.Fatalf("Recv: %v, %v; want the second echo", m, err)
	}
	st.CloseSend()
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("Recv after CloseSend: %v, want io.EOF", err)
	}
	if got := s.calls.Load(); got != 3 {
		t.Fatalf("server saw %d calls, want 3", got)
	}
}
