// Package aws is a stub for the analyzers' tests.
package aws

type Retryer interface{}

type NopRetryer struct{}

type Config struct {
	Region           string
	Retryer          func() Retryer
	RetryMaxAttempts int
}
