package alerts_test

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"

	"github.com/guardrail-go/guardrail/extra/prom/alerts"
)

// Write the rules next to prometheus.yml, or list the alerts they define.
func ExampleRules() {
	sc := bufio.NewScanner(bytes.NewReader(alerts.Rules()))
	for sc.Scan() {
		if name, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "- alert: "); ok {
			fmt.Println(name)
		}
	}
	// Output:
	// GuardrailErrorBudgetBurnFast
	// GuardrailErrorBudgetBurnSlow
	// GuardrailRetryRatioAboveBudget
	// GuardrailAttemptsPerCallAboveBudget
	// GuardrailBreakerOpenTooLong
	// GuardrailShedding
	// GuardrailThrottling
	// GuardrailDeadlineExhausted
	// GuardrailIdempotencyStoreErrors
	// GuardrailOutcomeUnknown
	// GuardrailConfigReloadRejected
	// GuardrailRetryAmplification
	// GuardrailSharedStoreFailing
	// GuardrailMetastable
}
