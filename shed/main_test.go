package shed_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/shed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mustNew returns shed.New(c), failing the test on an error.
func mustNew(tb testing.TB, c shed.Config) *shed.Shedder {
	tb.Helper()
	s, err := shed.New(c)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}
