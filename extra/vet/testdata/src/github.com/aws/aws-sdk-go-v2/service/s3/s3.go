// Package s3 is a stub for the analyzers' tests.
package s3

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
)

type Options struct{ Retryer aws.Retryer }

type Client struct{}

type GetObjectInput struct{ Key string }
type GetObjectOutput struct{}

func NewFromConfig(cfg aws.Config, optFns ...func(*Options)) *Client { return &Client{} }

func (c *Client) GetObject(ctx context.Context, in *GetObjectInput, optFns ...func(*Options)) (*GetObjectOutput, error) {
	return nil, nil
}
