package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

func init() {
	register(command{
		name:    "fault-server",
		summary: "serve a plain answer with injected faults (a misbehaving upstream for game days)",
		run:     runFaultServer,
	})
}

// maxBodySize bounds --body-size: the answer is kept in memory, and 64 MiB
// is more than any test of a slow or truncated body needs.
const maxBodySize = 64 << 20

// runFaultServer serves 200 with a fixed body to every request, except for
// the faults its rules inject.
func runFaultServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fault-server")
	var ff faultFlags
	ff.register(fs, "127.0.0.1:8081", "127.0.0.1:8082")
	body := fs.String("body", "ok\n", "the answer's body")
	size := fs.Int("body-size", 0, fmt.Sprintf("answer with this many bytes instead of --body (repeating it), at most %d", maxBodySize))
	help := flagHelp(`usage: guardrail fault-server [flags]

Serves "200 ok" to every request, except for the faults injected by the
rules (from --rules, --fault and the quick flags --latency, --error-rate,
--status, --retry-after, --reset-rate). Rules and counters can be read and
changed at run time on the admin endpoint: GET/PUT /rules.

The admin endpoint takes a body sent as application/json or
application/yaml only, and refuses requests from other web sites and Host
names other than localhost, IP addresses and --admin-host:

  curl -X PUT -H 'Content-Type: application/yaml' --data-binary @rules.yaml ADMIN/rules

Flags:
`, fs)
	if err := parseFlags(fs, args, stdout, help); err != nil {
		return err
	}
	switch {
	case *size < 0:
		return usageError{"--body-size is negative"}
	case *size > maxBodySize:
		// The answer is built in memory once, before the server listens.
		return usageError{fmt.Sprintf("--body-size %d is over the %d bytes an answer may hold", *size, maxBodySize)}
	}
	answer := *body
	if *size > 0 {
		if answer == "" {
			answer = "x"
		}
		answer = strings.Repeat(answer, *size/len(answer)+1)[:*size]
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		_, _ = io.WriteString(w, answer)
	})
	return serveFaults(ctx, "fault-server", fs, &ff, app, stdout, stderr)
}
