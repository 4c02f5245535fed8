package bench

import "github.com/guardrail-go/guardrail/guardhttp"

// guardhttpClients is guardhttp's row of BenchmarkHTTP: the zero Config,
// as a user gets it from one line.
func guardhttpClients() []httpClient {
	return []httpClient{{"guardhttp", guardhttp.NewClient(guardhttp.Config{})}}
}
