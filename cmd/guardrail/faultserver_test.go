package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/fault"
)

// noLeaks fails t if goroutines started during the test outlive it and its
// cleanups (registered first, so it runs last).
func noLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// lines collects what a command prints, line by line, for a test to wait on.
type lines struct {
	mu      sync.Mutex
	partial []byte
	all     []string
	c       chan string
}

func newLines() *lines { return &lines{c: make(chan string, 100)} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		l.all = append(l.all, line)
		select {
		case l.c <- line:
		default:
		}
	}
}

// next returns the next line that starts with prefix.
func (l *lines) next(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line := <-l.c:
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-timeout:
			t.Fatalf("no line starting with %q", prefix)
		}
	}
}

// running is a command started in-process.
type running struct {
	app, admin string // base URLs
	cancel     context.CancelFunc
	done       chan error
	stopped    bool
	stderr     *lines
	client     *http.Client
}

// start runs a fault command on ephemeral loopback ports and waits until it
// listens. The test fails if the command does not stop when cancelled.
func start(t *testing.T, run func(context.Context, []string, io.Writer, io.Writer) error, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := newLines(), newLines()
	r := &running{cancel: cancel, done: make(chan error, 1), stderr: stderr}
	args = append([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, args...)
	go func() { r.done <- run(ctx, args, stdout, stderr) }()
	r.app = "http://" + strings.Fields(stdout.next(t, ""))[3]
	r.admin = "http://" + strings.TrimPrefix(stdout.next(t, "admin listening on "), "admin listening on ")
	tr := &http.Transport{}
	r.client = &http.Client{Transport: tr}
	t.Cleanup(func() {
		r.stop(t)
		tr.CloseIdleConnections()
	})
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	if r.stopped {
		return
	}
	r.stopped = true
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("command returned %v, want nil after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("command did not stop after its context was cancelled")
	}
}

func (r *running) get(t *testing.T, path string) (*http.Response, string, error) {
	t.Helper()
	resp, err := r.client.Get(r.app + path)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}

type adminView struct {
	Rules    []map[string]any `json:"rules"`
	Counters []fault.Counter  `json:"counters"`
}

func (r *running) adminGet(t *testing.T) adminView {
	t.Helper()
	resp, err := r.client.Get(r.admin + "/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v adminView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// adminPut sends a rules file as curl does with -H 'Content-Type: application/json'.
func (r *running) adminPut(t *testing.T, body string) (int, string) {
	t.Helper()
	return r.adminSend(t, "PUT", "/rules", body, map[string]string{"Content-Type": "application/json"})
}

// adminSend sends a request to the admin endpoint with the given headers;
// a "Host" entry sets the Host header.
func (r *running) adminSend(t *testing.T, method, path, body string, header map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, r.admin+path, strings.NewReader(body))
	if body == "" {
		req.Body = nil
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestFaultServerQuickFlagsAndAdmin(t *testing.T) {
	noLeaks(t)
	r := start(t, runFaultServer, "--status", "503", "--retry-after", "2s", "--latency", "20ms", "--seed", "1")

	began := time.Now()
	resp, _, err := r.get(t, "/anything")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "2" {
		t.Errorf("got %d Retry-After %q, want 503 and 2", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if d := time.Since(began); d < 20*time.Millisecond {
		t.Errorf("answered after %v, want --latency 20ms first", d)
	}
	v := r.adminGet(t)
	want := []fault.Counter{{Rule: "flag-latency", Kind: "latency", Matched: 1, Fired: 1},
		{Rule: "flag-error", Kind: "error", Matched: 1, Fired: 1}}
	if len(v.Counters) != 2 || v.Counters[0] != want[0] || v.Counters[1] != want[1] {
		t.Errorf("counters = %+v, want %+v", v.Counters, want)
	}

	// Clear the rules at run time: the plain answer comes back.
	if code, msg := r.adminPut(t, `{"rules": []}`); code != 200 {
		t.Fatalf("PUT = %d %s", code, msg)
	}
	resp, body, err := r.get(t, "/")
	if err != nil || resp.StatusCode != 200 || body != "ok\n" {
		t.Errorf("after clearing: %v %v %q, want 200 \"ok\\n\"", resp, err, body)
	}
	// A bad rule is refused and named.
	if code, msg := r.adminPut(t, `rules: [{name: x, kind: error, status: 700}]`); code != 400 ||
		!strings.Contains(msg, "rule 0 (x): status") {
		t.Errorf("bad PUT = %d %q", code, msg)
	}
}

func TestFaultServerRulesFile(t *testing.T) {
	noLeaks(t)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(file, []byte(`
seed: 9
rules:
  - {name: cut, match: {path: /cut}, kind: reset}
  - {name: short, match: {path: /short}, kind: truncate}
`), 0o600)
	r := start(t, runFaultServer, "--rules", file, "--body-size", "1000")

	_, _, err := r.get(t, "/cut")
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("/cut: err = %v, want ECONNRESET", err)
	}
	resp, body, err := r.get(t, "/short")
	if !errors.Is(err, io.ErrUnexpectedEOF) || resp.ContentLength != 1000 || len(body) != 500 {
		t.Errorf("/short: %d of %d bytes, err %v; want 500 of 1000 then io.ErrUnexpectedEOF", len(body), resp.ContentLength, err)
	}
	resp, body, err = r.get(t, "/")
	if err != nil || resp.StatusCode != 200 || len(body) != 1000 {
		t.Errorf("/: %v, %d bytes; want 200 with 1000 bytes", err, len(body))
	}
}

func TestFaultServerShutdownReleasesHungRequests(t *testing.T) {
	noLeaks(t)
	r := start(t, runFaultServer, "--fault", "hang")
	errc := make(chan error, 1)
	go func() {
		_, _, err := r.get(t, "/")
		errc <- err
	}()
	// Wait until the request is held, as the admin endpoint sees it (each
	// look is a round trip, so this loop does not spin).
	for r.adminGet(t).Counters[0].Fired == 0 {
		select {
		case err := <-errc:
			t.Fatalf("request ended early: %v", err)
		default:
		}
	}
	began := time.Now()
	r.stop(t)
	if d := time.Since(began); d > 4*time.Second {
		t.Errorf("shutdown took %v with a hung request, want it released at once", d)
	}
	if err := <-errc; err == nil {
		t.Error("the hung request got an answer, want an aborted connection")
	}
}

func TestFaultServerUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--error-rate", "2"}, "--error-rate 2 is not between 0 and 1"},
		{[]string{"--reset-rate", "-1"}, "--reset-rate -1 is not between 0 and 1"},
		{[]string{"--status", "200"}, "status: 200 is not an error status"},
		{[]string{"--fault", "boom"}, `--fault "boom": fault: rule: kind: "boom" is not a fault kind`},
		{[]string{"--admin", "0.0.0.0:0"}, "is not a loopback address"},
		{[]string{"--admin", "127.0.0.1:0", "--admin-host", "ok.example", "--admin-host", "a/b", "--admin-host", "x:y"},
			`--admin-host "a/b", "x:y": want a host name or host:port`},
		{[]string{"--nope"}, "flag provided but not defined: -nope"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--body-size", "-1"}, "--body-size is negative"},
		{[]string{"--body-size", "10000000000"}, "--body-size 10000000000 is over the 67108864 bytes"},
	}
	for _, tt := range tests {
		err := runFaultServer(t.Context(), append([]string{"--listen", "127.0.0.1:0"}, tt.args...), io.Discard, io.Discard)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want a usage error containing %q", tt.args, err, tt.want)
		}
	}
	if err := runFaultServer(t.Context(), []string{"--help"}, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: err = %v, want flag.ErrHelp", err)
	}
	err := runFaultServer(t.Context(), []string{"--rules", filepath.Join(t.TempDir(), "missing.yaml")}, io.Discard, io.Discard)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing rules file: err = %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"rules":[{"kind":"latency"}]}`), 0o600)
	err = runFaultServer(t.Context(), []string{"--rules", bad}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "bad.json: fault: rule 0 (rule-0): delay: missing") {
		t.Errorf("bad rules file: err = %v", err)
	}
}

// What a web page can make a browser send to the admin endpoint changes
// nothing; curl with a JSON or YAML type still works.
func TestFaultServerAdminRefusesWebPages(t *testing.T) {
	noLeaks(t)
	r := start(t, runFaultServer, "--fault", "error; status=418", "--seed", "1", "--admin-host", "ops.internal")
	before := r.adminGet(t)
	hang := `{"rules":[{"name":"all","kind":"hang"}]}`
	for _, tt := range []struct {
		name   string
		path   string
		body   string
		header map[string]string
		want   int
	}{
		{"cross-site text/plain", "/rules", hang, map[string]string{"Content-Type": "text/plain", "Origin": "https://evil.example"}, 415},
		{"text/plain YAML", "/rules", "rules: [{name: all, kind: hang}]", map[string]string{"Content-Type": "text/plain"}, 415},
		{"form", "/rules", hang, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		{"cross-origin JSON", "/rules", hang, map[string]string{"Content-Type": "application/json", "Origin": "https://evil.example"}, 403},
		{"cross-origin YAML", "/rules", "rules: [{name: all, kind: hang}]",
			map[string]string{"Content-Type": "application/yaml", "Sec-Fetch-Site": "cross-site"}, 403},
		{"rebound name", "/rules", hang, map[string]string{"Content-Type": "application/json", "Host": "evil.example"}, 403},
		{"cross-site reset", "/counters/reset", "", map[string]string{"Origin": "https://evil.example"}, 403},
	} {
		if code, msg := r.adminSend(t, "POST", tt.path, tt.body, tt.header); code != tt.want {
			t.Errorf("%s: POST %s = %d %q, want %d", tt.name, tt.path, code, msg, tt.want)
		}
	}
	if code, _ := r.adminSend(t, "GET", "/rules", "", map[string]string{"Host": "evil.example:8082"}); code != 403 {
		t.Errorf("GET with a rebound name = %d, want 403", code)
	}
	after := r.adminGet(t)
	if len(after.Rules) != 1 || after.Rules[0]["status"] != 418.0 || after.Counters[0] != before.Counters[0] {
		t.Errorf("after the refused requests: %+v, want %+v", after, before)
	}
	if resp, _, err := r.get(t, "/"); err != nil || resp.StatusCode != 418 {
		t.Errorf("GET / after the refused requests: %v %v, want 418", resp, err)
	}

	for _, tt := range []struct {
		name   string
		body   string
		header map[string]string
	}{
		{"YAML", "rules: [{name: y, kind: error, status: 503}]", map[string]string{"Content-Type": "application/yaml"}},
		{"YAML sent as JSON", "rules: [{name: y, kind: error, status: 503}]", map[string]string{"Content-Type": "application/json"}},
		{"JSON by a listed name", `{"rules":[{"name":"y","kind":"error","status":503}]}`,
			map[string]string{"Content-Type": "application/json", "Host": "ops.internal:8092"}},
	} {
		if code, msg := r.adminSend(t, "PUT", "/rules", tt.body, tt.header); code != 200 {
			t.Errorf("%s: PUT = %d %q, want 200", tt.name, code, msg)
		}
		if v := r.adminGet(t); len(v.Rules) != 1 || v.Rules[0]["status"] != 503.0 {
			t.Errorf("%s: rules = %+v, want the 503 rule", tt.name, v.Rules)
		}
		r.adminPut(t, `{"rules":[]}`)
	}
	if code, msg := r.adminSend(t, "POST", "/counters/reset", "", nil); code != 200 {
		t.Errorf("curl's counter reset = %d %q", code, msg)
	}
}
