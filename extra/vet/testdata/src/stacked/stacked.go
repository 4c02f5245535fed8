package stacked

import (
	"context"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/guardhttp"
	retryablehttp "github.com/hashicorp/go-retryablehttp"
)

var policy = &guardrail.Policy{Name: "users"}
var once = &guardrail.Policy{Name: "users", MaxAttempts: 1}

func aroundGuardhttp(ctx context.Context, req *http.Request) {
	client, _ := guardhttp.NewClient(guardhttp.Config{Name: "users"})
	guardrail.Do(ctx, policy, func(ctx context.Context) (*http.Response, error) {
		return client.Do(req) // want `\[stacked\] guardrail.Do retries \(3 attempts\) around a guardhttp client, which retries on its own \(3 attempts\): the attempts multiply to 9`
	})
	guardrail.Do(ctx, once, func(ctx context.Context) (*http.Response, error) {
		return client.Do(req) // the outer layer does not retry: fine
	})
	single, _ := guardhttp.NewClient(guardhttp.Config{MaxAttempts: 1})
	guardrail.Do(ctx, policy, func(ctx context.Context) (*http.Response, error) {
		return single.Do(req) // the client does not retry: fine
	})
}

type service struct{ client *http.Client }

func newService() *service {
	t, err := guardhttp.NewTransport(nil, guardhttp.Config{MaxAttempts: 4})
	if err != nil {
		panic(err)
	}
	return &service{client: &http.Client{Transport: t}}
}

func (s *service) get(ctx context.Context, req *http.Request) {
	guardrail.Do(ctx, nil, func(ctx context.Context) (*http.Response, error) {
		return s.client.Do(req) // want `guardrail.Do retries \(3 attempts\) around a guardhttp client, which retries on its own \(4 attempts\)`
	})
}

func aroundRetryable(ctx context.Context) {
	rc := retryablehttp.NewClient()
	guardrail.Do(ctx, policy, func(ctx context.Context) (*http.Response, error) {
		return rc.Get("http://x") // want `around a go-retryablehttp client, which retries on its own \(5 attempts\)`
	})
	std := rc.StandardClient()
	guardrail.Do(ctx, policy, func(ctx context.Context) (*http.Response, error) {
		return std.Get("http://x") // want `around a go-retryablehttp client`
	})
	quiet := retryablehttp.NewClient()
	quiet.RetryMax = 0
	guardrail.Do(ctx, policy, func(ctx context.Context) (*http.Response, error) {
		return quiet.Get("http://x") // retries switched off: fine
	})
}

func aroundAWS(ctx context.Context) {
	cfg, _ := config.LoadDefaultConfig(ctx)
	client := s3.NewFromConfig(cfg)
	guardrail.Do(ctx, policy, func(ctx context.Context) (*s3.GetObjectOutput, error) {
		return client.GetObject(ctx, &s3.GetObjectInput{}) // want `around an AWS SDK client with its default retryer`
	})
	nop, _ := config.LoadDefaultConfig(ctx, config.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }))
	quiet := s3.NewFromConfig(nop)
	guardrail.Do(ctx, policy, func(ctx context.Context) (*s3.GetObjectOutput, error) {
		return quiet.GetObject(ctx, &s3.GetObjectInput{}) // retryer replaced: fine
	})
}

func nested(ctx context.Context, op func(context.Context) (int, error)) {
	guardrail.Do(ctx, policy, func(ctx context.Context) (int, error) {
		return guardrail.Do(ctx, &guardrail.Policy{MaxAttempts: 2}, op) // want `guardrail.Do inside guardrail.Do, both retrying \(3 and 2 attempts\): the attempts multiply to 6`
	})
}

func unknownPolicy(ctx context.Context, p *guardrail.Policy, c *http.Client, req *http.Request) {
	guardrail.Do(ctx, p, func(ctx context.Context) (*http.Response, error) {
		return c.Do(req) // neither side can be traced: fine
	})
}

func configuredAfter(ctx context.Context, req *http.Request) {
	cfg := guardhttp.Config{Name: "users"}
	cfg.MaxAttempts = 1
	c, err := guardhttp.NewClient(cfg)
	if err != nil {
		return
	}
	guardrail.Do(ctx, policy, func(ctx context.Context) (*http.Response, error) {
		return c.Do(req) // MaxAttempts set to 1 before the client was built: fine
	})
}

func retryableOverGuardhttp() {
	gc, _ := guardhttp.NewClient(guardhttp.Config{Name: "users"})
	rc := retryablehttp.NewClient()
	rc.HTTPClient = gc                                     // want `go-retryablehttp \(5 attempts\) sends through a guardhttp client that retries on its own \(3 attempts\): the attempts multiply to 15`
	_ = &retryablehttp.Client{HTTPClient: gc, RetryMax: 2} // want `go-retryablehttp \(3 attempts\)`
	_ = &retryablehttp.Client{HTTPClient: gc, RetryMax: 0} // retries off on one side: fine
	once, _ := guardhttp.NewClient(guardhttp.Config{MaxAttempts: 1})
	rc2 := retryablehttp.NewClient()
	rc2.HTTPClient = once // fine
}
