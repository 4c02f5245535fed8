package breaker_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/breaker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mustNew is breaker.New for configurations the test knows are valid.
func mustNew(cfg breaker.Config) *breaker.Breaker {
	b, err := breaker.New(cfg)
	if err != nil {
		panic(err)
	}
	return b
}

// mustGroup is breaker.NewGroup for configurations the test knows are valid.
func mustGroup(cfg breaker.GroupConfig) *breaker.Group {
	g, err := breaker.NewGroup(cfg)
	if err != nil {
		panic(err)
	}
	return g
}

// defaultOpenFor is the open time of a zero Config (before jitter).
var defaultOpenFor = breaker.DefaultConfig().OpenFor
