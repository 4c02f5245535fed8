package guardrail_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
)

func TestDefaultClassify(t *testing.T) {
	dialRefused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	tests := []struct {
		name string
		err  error
		want guardrail.Verdict
	}{
		{"canceled", fmt.Errorf("get: %w", context.Canceled), guardrail.Verdict{Outcome: breaker.Ignored}},
		{"refused", dialRefused, guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Unsent: true}},
		{"dns", &net.DNSError{Err: "no such host", Name: "x"}, guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Unsent: true}},
		{"dial timeout", &net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}, guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Unsent: true, Timeout: true}},
		{"deadline", context.DeadlineExceeded, guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Timeout: true}},
		{"read timeout", &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Timeout: true}},
		{"reset", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Unanswered: true}},
		{"eof", io.ErrUnexpectedEOF, guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Unanswered: true}},
		{"other", errBoom, guardrail.Verdict{Outcome: breaker.Failure, Retryable: true}},
		{"permanent", guardrail.Permanent(errBoom), guardrail.Verdict{Outcome: breaker.Ignored}},
		{"transient", guardrail.Transient(errBoom), guardrail.Verdict{Outcome: breaker.Failure, Retryable: true}},
		{"unsent", guardrail.Unsent(errBoom), guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Unsent: true}},
		{"retry-after", fmt.Errorf("wrapped: %w", guardrail.RetryAfterError(errBoom, time.Second)), guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, RetryAfter: time.Second}},
		{"verdict", guardrail.WithVerdict(errBoom, guardrail.Verdict{Outcome: breaker.Success}), guardrail.Verdict{Outcome: breaker.Success}},
	}
	for _, tt := range tests {
		if got := guardrail.DefaultClassify(tt.err); got != tt.want {
			t.Errorf("%s: DefaultClassify = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestMarkersKeepTheCauseAndNil(t *testing.T) {
	for _, mark := range []func(error) error{guardrail.Permanent, guardrail.Transient, guardrail.Unsent,
		func(e error) error { return guardrail.RetryAfterError(e, time.Second) }} {
		if mark(nil) != nil {
			t.Error("marking nil must give nil")
		}
		err := mark(errBoom)
		if !errors.Is(err, errBoom) || err.Error() != "boom" {
			t.Errorf("marked error %q lost its cause", err)
		}
	}
}
