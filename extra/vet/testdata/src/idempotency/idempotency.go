package idempotency

import (
	"bytes"
	"context"
	"net/http"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/guardhttp"
)

var client, _ = guardhttp.NewClient(guardhttp.Config{Name: "payments"})
var keyed, _ = guardhttp.NewClient(guardhttp.Config{Name: "payments", IdempotencyKeys: true})
var single, _ = guardhttp.NewClient(guardhttp.Config{MaxAttempts: 1})

func charge(ctx context.Context, body []byte) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay/charges", bytes.NewReader(body))
	client.Do(req) // want `\[idempotency\] POST through a retrying guardhttp client, with no Idempotency-Key`

	req2, _ := http.NewRequestWithContext(ctx, "PATCH", "http://pay/charges/1", nil)
	client.Do(req2) // want `PATCH through a retrying guardhttp client`

	client.Post("http://pay/charges", "application/json", nil) // want `POST through a retrying guardhttp client`

	req3, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay/charges", nil)
	req3.Header.Set("Idempotency-Key", "k1")
	client.Do(req3) // keyed: fine

	req4, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay/charges", nil)
	keyed.Do(req4) // the client generates keys: fine

	req5, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay/charges", nil)
	single.Do(req5) // the client does not retry: fine

	req6, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://pay/charges", nil)
	client.Do(req6) // a GET is idempotent: fine

	req7, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay/charges", nil)
	sign(req7) // a helper may set the key: fine
	client.Do(req7)
}

func sign(*http.Request) {}

func viaPolicy(ctx context.Context, c *http.Client) {
	p := &guardrail.Policy{Name: "pay", Idempotent: true}
	guardrail.Do(ctx, p, func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay/charges", nil)
		return c.Do(req) // want `POST inside guardrail.Do with a Policy declared Idempotent, with no Idempotency-Key`
	})
	guardrail.Do(ctx, p, func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay/charges", nil)
		req.Header["Idempotency-Key"] = []string{"k"}
		return c.Do(req) // keyed: fine
	})
	notIdem := &guardrail.Policy{Name: "pay"}
	guardrail.Do(ctx, notIdem, func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay/charges", nil)
		return c.Do(req) // not declared idempotent: guardrail will not resend it once sent; fine
	})
}
