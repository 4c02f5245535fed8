package bench

import "github.com/guardrail-go/guardrail/guardhttp"

// guardhttpClients is guardhttp's row of BenchmarkHTTP: the zero Config,
// as a user gets it from one line.
func guardhttpClients() []httpClient {
	c, err := guardhttp.NewClient(guardhttp.Config{})
	if err != nil {
		panic(err) // the zero Config is valid
	}
	return []httpClient{{"guardhttp", c}}
}
