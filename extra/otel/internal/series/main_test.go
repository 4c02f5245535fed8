package series

import (
	"testing"

	"go.uber.org/goleak"
)

// The cache and gauge tests run goroutines; none may outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
