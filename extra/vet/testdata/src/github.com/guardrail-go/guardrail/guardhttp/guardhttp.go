// Package guardhttp is a stub of the real package for the analyzers' tests.
package guardhttp

import (
	"net/http"
	"time"
)

type Config struct {
	Name            string
	MaxAttempts     int
	IdempotencyKeys bool
	AttemptTimeout  time.Duration
}

type Transport struct{}

func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) { return nil, nil }

func NewTransport(base http.RoundTripper, cfg Config) (*Transport, error) { return &Transport{}, nil }

func NewClient(cfg Config) (*http.Client, error) { return &http.Client{}, nil }
