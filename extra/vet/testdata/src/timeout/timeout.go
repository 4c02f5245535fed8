package timeout

import (
	"context"
	"net"
	"net/http"
	"strings"
	"time"
)

func packageLevel() {
	http.Get("http://x")                     // want `\[timeout\] http.Get uses http.DefaultClient`
	http.Post("http://x", "text/plain", nil) // want `http.Post uses http.DefaultClient`
	http.Head("http://x")                    // want `http.Head uses`
	http.PostForm("http://x", nil)           // want `http.PostForm uses`
	http.DefaultClient.Do(nil)               // want `http.DefaultClient has no timeout`
	var c = http.DefaultClient               // want `http.DefaultClient has no timeout`
	_ = c
}

func defaultClientNotUsed(c *http.Client) {
	if c == http.DefaultClient { // compared, not called through: fine
		return
	}
	http.DefaultClient.Timeout = 5 * time.Second // configured: fine
	copied := *http.DefaultClient                // a copy to configure: fine
	copied.Timeout = time.Second
}

func clients() {
	_ = &http.Client{}                                                                                         // want `http.Client without Timeout and without a Transport`
	_ = http.Client{Transport: http.DefaultTransport}                                                          // want `http.Client without Timeout`
	_ = &http.Client{Transport: &http.Transport{Proxy: nil}}                                                   // want `http.Client without Timeout`
	_ = new(http.Client)                                                                                       // want `new\(http.Client\) has no Timeout`
	_ = &http.Client{Timeout: 10 * time.Second}                                                                // fine
	_ = &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: time.Second}}                           // fine
	_ = &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: time.Second}).DialContext}} // fine
	_ = &http.Client{Transport: someTransport()}                                                               // unknown transport: fine
	_ = &http.Client{Timeout: 0}                                                                               // want `http.Client without Timeout`
}

func someTransport() http.RoundTripper { return nil }

func configuredLater() *http.Client {
	c := &http.Client{}
	c.Timeout = 3 * time.Second
	return c
}

type holder struct{ client *http.Client }

func configuredField(h *holder) {
	h.client = &http.Client{}
	h.client.Transport = someTransport()
}

func dials(ctx context.Context) {
	net.Dial("tcp", "x:1")                     // want `net.Dial has no timeout`
	net.DialTimeout("tcp", "x:1", time.Second) // fine
	d := net.Dialer{}
	d.Dial("tcp", "x:1") // want `net.Dialer.Dial with neither Timeout nor Deadline`
	d2 := &net.Dialer{Timeout: time.Second}
	d2.Dial("tcp", "x:1")            // fine
	d.DialContext(ctx, "tcp", "x:1") // fine: the context bounds it
}

func withCtx(ctx context.Context, c *http.Client) {
	req, _ := http.NewRequest("GET", "http://x", nil) // want `http.NewRequest drops the caller's context although ctx is at hand`
	c.Do(req)
	req2, _ := http.NewRequest("GET", "http://x", nil) // given the context afterwards: fine
	c.Do(req2.WithContext(ctx))
}

func handler(w http.ResponseWriter, r *http.Request) {
	req, _ := http.NewRequest("GET", "http://x", strings.NewReader("")) // want `although r.Context\(\) is at hand`
	_ = req
}

func noCtx(c *http.Client) {
	req, _ := http.NewRequest("GET", "http://x", nil) // no context at hand: fine
	c.Do(req)
}

func builder(ctx context.Context) (*http.Request, error) {
	req, err := http.NewRequest("GET", "http://x", nil) // returned: the caller may give it a context
	return req, err
}

func suppressed() {
	//guardrail:ignore timeout the health probe runs under the kernel's connect timeout on purpose
	http.Get("http://x")
	http.Get("http://x") //guardrail:ignore timeout,deadline one-shot CLI call, interrupted by the user
	http.Get("http://x") /* want `suppression without a reason` `http.Get uses` */ //guardrail:ignore timeout
	//guardrail:ignore retryloop a suppression of another check leaves this one
	http.Get("http://x") // want `http.Get uses`
}

type apiClient struct{}

func (apiClient) Do(ctx context.Context, req *http.Request) {}

func handedOver(ctx context.Context, c apiClient) {
	req, _ := http.NewRequest("GET", "http://x", nil) // handed over with ctx, which the callee attaches: fine
	c.Do(ctx, req)
}

func newClient(c *http.Client) *http.Client {
	if c.Transport == nil {
		c.Transport = &http.Transport{ResponseHeaderTimeout: time.Second}
	}
	return c
}

func keep(c *http.Client) *http.Client { return c }

func viaConstructors() {
	_ = newClient(&http.Client{})                // the callee sets a Transport: fine
	_ = keep(&http.Client{})                     // want `http.Client without Timeout`
	_, _ = strings.NewReader(""), &http.Client{} // want `http.Client without Timeout`
}

func elsewhere() {
	otherPackage(&http.Client{}) // fine: a function we cannot see may configure it
}

var otherPackage = func(*http.Client) {}
