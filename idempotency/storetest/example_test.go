package storetest_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/idempotency/memstore"
	"github.com/guardrail-go/guardrail/idempotency/storetest"
)

// A Store's own tests run the conformance suite and the end-to-end HTTP
// tests against it. This is memstore's, whose clock is the process clock,
// so its store tests run in a synctest bubble where sleeping is instant.
func Example() {
	testStore := func(t *testing.T) {
		h := storetest.Harness{
			New: func(t *testing.T) storetest.Subject {
				s, err := memstore.New(memstore.Config{})
				if err != nil {
					t.Fatal(err)
				}
				return storetest.Subject{Store: s, Advance: time.Sleep}
			},
			Bubble: synctest.Test,
		}
		t.Run("Store", func(t *testing.T) { storetest.Run(t, h) })
		t.Run("HTTP", func(t *testing.T) { storetest.RunHTTP(t, h) })
	}
	_ = testStore // in a _test.go file: func TestStore(t *testing.T) { testStore(t) }
}
