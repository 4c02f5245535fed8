// Package guardhttp guards outbound HTTP calls: an http.RoundTripper and an
// *http.Client with phase timeouts, safe retries and deadline propagation.
package guardhttp
