package guardhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// A GET whose first attempt is stuck in the server's slow tail: after
// 50 ms without response headers a hedge is sent, its answer is returned,
// and the stuck request is cancelled (the server sees its context end).
func ExampleConfig_hedge() {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			<-r.Context().Done() // the slow tail, until the client gives up on it
			return
		}
		io.WriteString(w, "answer of the hedge")
	}))
	defer srv.Close()

	client, err := guardhttp.NewClient(guardhttp.Config{
		Hedge: &guardrail.HedgeConfig{Delay: 50 * time.Millisecond},
	})
	if err != nil {
		panic(err)
	}
	defer client.CloseIdleConnections()
	resp, err := client.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(body), requests.Load())
	// Output: answer of the hedge 2
}
