// Package config is a stub for the analyzers' tests.
package config

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
)

type LoadOptions struct{}

func LoadDefaultConfig(ctx context.Context, optFns ...func(*LoadOptions) error) (aws.Config, error) {
	return aws.Config{}, nil
}

func WithRegion(r string) func(*LoadOptions) error              { return nil }
func WithRetryer(f func() aws.Retryer) func(*LoadOptions) error { return nil }
func WithRetryMaxAttempts(n int) func(*LoadOptions) error       { return nil }
