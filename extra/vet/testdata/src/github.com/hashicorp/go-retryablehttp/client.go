// Package retryablehttp is a stub for the analyzers' tests.
package retryablehttp

import "net/http"

type Request struct{ *http.Request }

type Client struct {
	HTTPClient *http.Client
	RetryMax   int
}

func NewClient() *Client                                        { return &Client{RetryMax: 4} }
func NewRequest(method, url string, body any) (*Request, error) { return nil, nil }
func (c *Client) Do(req *Request) (*http.Response, error)       { return nil, nil }
func (c *Client) Get(url string) (*http.Response, error)        { return nil, nil }
func (c *Client) StandardClient() *http.Client                  { return nil }
