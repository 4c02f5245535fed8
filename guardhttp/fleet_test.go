package guardhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/fleet"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// A fleet.Semaphore behind the Transport's bulkhead: the fleet's slot is
// held until the response body is closed, and a request refused because
// the fleet's slots are taken is ErrBulkheadFull like a local refusal.
func TestBulkheadSharedByFleet(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	sem, err := fleet.NewSemaphore(fleet.SemaphoreConfig{Store: new(fleet.MemorySemaphoreStore), Name: "api", Limit: 1, MaxWait: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	c := newClient(t, guardhttp.Config{Bulkhead: &bulkhead.Config{MaxConcurrent: 10, Shared: sem}})
	ctx := context.Background()

	resp, err := get(t, ctx, c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if sem.Held() != 1 {
		t.Fatalf("the fleet's slots held with the body open: %d; want 1", sem.Held())
	}
	resp.Body.Close()
	if sem.Held() != 0 {
		t.Fatalf("the fleet's slots held after the body closed: %d; want 0", sem.Held())
	}

	release, err := sem.Acquire(ctx) // another process of the fleet
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	_, err = get(t, ctx, c, srv.URL)
	if !errors.Is(err, guardrail.ErrBulkheadFull) || !errors.Is(err, fleet.ErrFull) {
		t.Fatalf("err = %v; want ErrBulkheadFull from fleet.ErrFull", err)
	}
}
