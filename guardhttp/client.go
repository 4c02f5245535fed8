package guardhttp

import (
	"net/http"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
)

// Client is the *http.Client that NewClient builds, with typed access to
// the Transport under it, so that its retry budget and breakers can be
// watched (exported as metrics, say) without a type assertion on
// http.Client.Transport.
//
// Its methods Get, Do, Post and the others are those of the embedded
// *http.Client. Transport is a method here, not the field: the field is
// Client.Client.Transport. Wrapping that field (for tracing, say) changes
// what requests go through, not what Transport, RetryBudget and Breakers
// return.
//
// A Client is safe for concurrent use, as *http.Client is.
type Client struct {
	*http.Client
	transport *Transport
}

// New returns a Client built as NewClient builds its *http.Client. It
// returns an error naming the field if cfg is invalid (see Config).
func New(cfg Config) (*Client, error) {
	c, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{Client: c, transport: c.Transport.(*Transport)}, nil
}

// Transport returns the Transport under the client.
func (c *Client) Transport() *Transport { return c.transport }

// RetryBudget returns the budget the client's retries are spent from.
func (c *Client) RetryBudget() *budget.Budget { return c.transport.RetryBudget() }

// Breakers returns the group holding the breaker of each key.
func (c *Client) Breakers() *breaker.Group { return c.transport.Breakers() }
