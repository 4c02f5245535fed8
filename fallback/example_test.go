package fallback_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/guardrail-go/guardrail/fallback"
)

// During an outage, the last good price is served marked stale; a price
// never seen is an error, not a price of 0.
func ExampleCache_Do() {
	prices, err := fallback.NewCache[string, int](fallback.CacheConfig{TTL: 5 * time.Minute})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	up := func(context.Context) (int, error) { return 100, nil }
	down := func(context.Context) (int, error) { return 0, errors.New("pricing: timeout") }

	r, err := prices.Do(ctx, "sku-1", up)
	fmt.Println(r.Value, r.Stale, err)
	r, err = prices.Do(ctx, "sku-1", down)
	fmt.Println(r.Value, r.Stale, err, r.Err)
	_, err = prices.Do(ctx, "sku-2", down)
	fmt.Println(err)
	// Output:
	// 100 false <nil>
	// 100 true <nil> pricing: timeout
	// fallback: no last-good value to serve: pricing: timeout
}

// B is required and C optional; C fails (or runs past its 900 ms budget,
// which is the same), so the answer comes without it, marked partial in the
// body and the headers.
func ExampleFanout() {
	ctx, cancel := context.WithTimeout(context.Background(), 1900*time.Millisecond)
	defer cancel()
	callB := func(context.Context) (string, error) { return "ok", nil }
	callC := func(context.Context) (string, error) { return "", errors.New("C: 503") }

	g := fallback.NewFanout(ctx)
	b := fallback.Required(g, "B", 900*time.Millisecond, callB)
	c := fallback.Optional(g, "C", 900*time.Millisecond, callC)
	if err := g.Wait(); err != nil {
		fmt.Println("error:", err) // a 503 or 504 for the whole request
		return
	}

	partial := len(g.Missing()) > 0
	body := map[string]any{"partial": partial, "C": nil}
	body["B"], _ = b.Value()
	if v, ok := c.Value(); ok {
		body["C"] = v
	}
	w := httptest.NewRecorder()
	if partial {
		fallback.MarkPartial(w.Header())
	}
	json.NewEncoder(w).Encode(body)
	fmt.Print(w.Body.String())
	fmt.Println(w.Header().Get("X-Partial"), w.Header().Get("Cache-Control"), g.Missing())
	// Output:
	// {"B":"ok","C":null,"partial":true}
	// true no-store [C]
}
