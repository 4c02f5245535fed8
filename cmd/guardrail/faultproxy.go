package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
)

func init() {
	register(command{
		name:    "fault-proxy",
		summary: "reverse proxy to --to URL that injects faults in front of a real service",
		run:     runFaultProxy,
	})
}

// runFaultProxy forwards requests to --to, except for the faults its rules
// inject.
func runFaultProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fault-proxy")
	var ff faultFlags
	ff.register(fs, "127.0.0.1:8091", "127.0.0.1:8092")
	to := fs.String("to", "", "URL of the service to proxy to (required)")
	help := flagHelp(`usage: guardrail fault-proxy --to URL [flags]

Forwards every request to the service at --to, except for the faults
injected by the rules (from --rules, --fault and the quick flags --latency,
--error-rate, --status, --retry-after, --reset-rate). Rules and counters can
be read and changed at run time on the admin endpoint: GET/PUT /rules.

HTTP only: for gRPC, put the grpcfault interceptors on the server or the
client instead (docs/fault.md says why a proxy cannot fake gRPC failures).

The admin endpoint takes a body sent as application/json or
application/yaml only, and refuses requests from other web sites and Host
names other than localhost, IP addresses and --admin-host:

  curl -X PUT -H 'Content-Type: application/yaml' --data-binary @rules.yaml ADMIN/rules

Flags:
`, fs)
	if err := parseFlags(fs, args, stdout, help); err != nil {
		return err
	}
	if *to == "" {
		return usageError{"--to is required"}
	}
	target, err := url.Parse(*to)
	if err != nil || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
		return usageError{fmt.Sprintf("--to %q is not an http:// or https:// URL", *to)}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	// An upstream that is down fails every request: its errors are logged
	// in bursts, not one line each.
	errs := newErrorSummary(stderr, "guardrail fault-proxy: ", proxyErrorInterval)
	defer errs.Close()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.SetXForwarded()
		},
		Transport:    tr,
		ErrorHandler: errs.proxyError,
		ErrorLog:     log.New(errs, "", 0),
	}
	return serveFaults(ctx, "fault-proxy", fs, &ff, proxy, stdout, stderr)
}
