package fault_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/fault"
)

// Injected client-side failures must be classified like the real ones by
// guardrail's default classifier: a refusal is unsent (safe to retry for
// any method), a reset or a lost response is not, a hang is a timeout.
func TestInjectedErrorsClassifyLikeRealOnes(t *testing.T) {
	tests := []struct {
		fault   fault.Fault
		unsent  bool
		timeout bool
	}{
		{fault.Refuse{}, true, false},
		{fault.Reset{}, false, false},
		{fault.Hang{}, false, true},
	}
	for _, tt := range tests {
		in, err := fault.New(fault.Config{Rules: []fault.Rule{{Fault: tt.fault}}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://dep.test/pay", nil)
		_, err = (&http.Client{Transport: in.Transport(nil)}).Do(req)
		cancel()
		v := guardrail.DefaultClassify(err)
		if v.Outcome != breaker.Failure || !v.Retryable || v.Unsent != tt.unsent || v.Timeout != tt.timeout {
			t.Errorf("%T: %v classified %+v, want failure, retryable, unsent %v, timeout %v",
				tt.fault, err, v, tt.unsent, tt.timeout)
		}
	}
}
