package shed_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/guardrail-go/guardrail/shed"
)

// Acquire is the transport-neutral API: Normal requests fill 85 % of the
// limit, and the rest is kept for higher priorities.
func Example() {
	s, err := shed.New(shed.Config{Limit: 10})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	var held []shed.Token
	for {
		tok, err := s.Acquire(ctx, shed.Normal)
		if errors.Is(err, shed.ErrShed) {
			fmt.Printf("normal refused with %d in flight: %v\n", len(held), err)
			break
		}
		held = append(held, tok)
	}
	tok, err := s.Acquire(ctx, shed.Critical)
	fmt.Println("critical admitted:", err == nil)
	tok.Release()
	for _, tok := range held {
		tok.Release()
	}
	fmt.Println("in flight after release:", s.Stats().InFlight)
	// Output:
	// normal refused with 9 in flight: shed: request shed: capacity (priority normal)
	// critical admitted: true
	// in flight after release: 0
}

// The middleware answers 503 with Retry-After at once, without running the
// handler, and lets trusted callers claim a priority with a header.
func ExampleShedder_Middleware() {
	s, err := shed.New(shed.Config{
		Limit:             2,
		MaxHeaderPriority: shed.High, // callers may claim up to High
	})
	if err != nil {
		panic(err)
	}
	h := s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "served")
	}))

	busy, _ := s.Acquire(context.Background(), shed.Critical) // one request in flight: 50 % used
	defer busy.Release()
	for _, priority := range []string{"sheddable", "critical"} {
		req := httptest.NewRequest(http.MethodGet, "/report", nil)
		req.Header.Set(shed.HeaderPriority, priority)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Printf("%s: %d Retry-After=%q %q\n", priority, rec.Code, rec.Header().Get("Retry-After"), rec.Body.String())
	}
	// Output:
	// sheddable: 503 Retry-After="1" ""
	// critical: 200 Retry-After="" "served\n"
}
