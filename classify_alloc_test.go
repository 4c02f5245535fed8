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

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
)

// asTimeout is an error that converts itself to a net.Error through an As
// method, as some libraries' errors do: DefaultClassify must honour it as
// errors.As does.
type asTimeout struct{}

func (asTimeout) Error() string { return "as timeout" }
func (asTimeout) As(target any) bool {
	if p, ok := target.(*net.Error); ok {
		*p = &net.DNSError{Err: "timeout", IsTimeout: true}
		return true
	}
	return false
}

func classifyCases() map[string]error {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	return map[string]error{
		"plain":         io.ErrUnexpectedEOF,
		"wrapped":       fmt.Errorf("get: %w", io.EOF),
		"joined":        errors.Join(errors.New("a"), fmt.Errorf("b: %w", context.DeadlineExceeded)),
		"marked":        fmt.Errorf("x: %w", guardrail.Permanent(io.EOF)),
		"marked-joined": errors.Join(io.EOF, guardrail.Unsent(io.EOF)),
		"dial":          dial,
		"dns":           &net.DNSError{Err: "no such host", IsNotFound: true},
		"deadline":      os.ErrDeadlineExceeded,
		"canceled":      fmt.Errorf("op: %w", context.Canceled),
		"as-method":     fmt.Errorf("lib: %w", asTimeout{}),
	}
}

// DefaultClassify runs on every failed attempt: it allocates nothing for
// the usual errors.
func TestDefaultClassifyDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage counters change allocation counts")
	}
	for name, err := range classifyCases() {
		if name == "as-method" {
			continue // errors.As's target escapes, by its signature
		}
		if n := testing.AllocsPerRun(100, func() { guardrail.DefaultClassify(err) }); n != 0 {
			t.Errorf("%s: %v allocs, want 0", name, n)
		}
	}
}

// The allocation-free walk gives the verdicts errors.As and errors.Is
// would: those of the marked error found first in the tree, and the
// plain rules otherwise, As methods included.
func TestDefaultClassifyVerdicts(t *testing.T) {
	f, r, ru, ig := breaker.Failure, true, true, breaker.Ignored
	want := map[string]guardrail.Verdict{
		"plain":         {Outcome: f, Retryable: r, Unanswered: true},
		"wrapped":       {Outcome: f, Retryable: r},
		"joined":        {Outcome: f, Retryable: r, Timeout: true},
		"marked":        {Outcome: ig},
		"marked-joined": {Outcome: f, Retryable: r, Unsent: ru},
		"dial":          {Outcome: f, Retryable: r, Unsent: ru},
		"dns":           {Outcome: f, Retryable: r, Unsent: ru},
		"deadline":      {Outcome: f, Retryable: r, Timeout: true},
		"canceled":      {Outcome: ig},
		"as-method":     {Outcome: f, Retryable: r, Timeout: true},
	}
	for name, err := range classifyCases() {
		if got := guardrail.DefaultClassify(err); got != want[name] {
			t.Errorf("%s: %+v, want %+v", name, got, want[name])
		}
	}
}
