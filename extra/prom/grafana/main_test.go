package grafana_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests describe the collector from a goroutine; none may outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
