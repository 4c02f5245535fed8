package vet_test

import (
	"testing"

	"github.com/guardrail-go/guardrail/extra/vet"
	"golang.org/x/tools/go/analysis/analysistest"
)

func TestTimeout(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), vet.Timeout, "timeout", "testsupport")
}

func TestDeadline(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), vet.Deadline, "deadline")
}

func TestRetryLoop(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), vet.RetryLoop, "retryloop")
}

func TestStacked(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), vet.Stacked, "stacked")
}

func TestIdempotency(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), vet.Idempotency, "idempotency")
}

func TestTiers(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), vet.Tiers, "tiers")
}
