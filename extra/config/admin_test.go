package config

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/guardrail-go/guardrail/breaker"
)

func TestNewAdminRefusesOpenWrites(t *testing.T) {
	reg, err := New("policy.yaml", []byte(testFile), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewAdmin(reg, AdminConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewAdmin without Authorize: %v; want ErrInvalidConfig", err)
	}
	a, err := NewAdmin(reg, AdminConfig{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	ts := newServer(t, a)
	resp, err := http.Post(ts.URL+"/breakers/ledger/open?reason=x", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a write to a read-only endpoint: %d; want 403", resp.StatusCode)
	}
	if p, _ := reg.Policy("ledger"); p.Policy().Breaker.State() != breaker.Closed {
		t.Error("a read-only endpoint changed a breaker")
	}
}

func TestAdminListsAndForcesBreakers(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	reg, err := New("policy.yaml", []byte(testFile), Options{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	const token = "Bearer s3cret"
	a, err := NewAdmin(reg, AdminConfig{Authorize: func(r *http.Request) error {
		if r.Header.Get("Authorization") != token {
			return errors.New("not an operator")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	admin := newServer(t, a)
	backend := &counting{}
	ts := newServer(t, backend)
	client, _ := reg.HTTPClient("svc")
	if code, err := get(t, client, ts.URL); err != nil || code != 200 {
		t.Fatal(code, err)
	}
	host := strings.TrimPrefix(ts.URL, "http://")

	post := func(path, auth string, form url.Values) (int, string) {
		body := map[string]string{}
		for k := range form {
			body[k] = form.Get(k)
		}
		js, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, admin.URL+path, bytes.NewReader(js))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := post("/breakers/svc/open?key="+host, "", url.Values{"reason": {"drill"}}); code != http.StatusForbidden {
		t.Errorf("a write without authorisation: %d; want 403", code)
	}
	if code, _ := post("/breakers/svc/open?key="+host, token, nil); code != http.StatusBadRequest {
		t.Errorf("a write without a reason: %d; want 400", code)
	}
	if code, _ := post("/breakers/nope/open", token, url.Values{"reason": {"drill"}}); code != http.StatusNotFound {
		t.Errorf("an unknown dependency: %d; want 404", code)
	}
	if code, body := post("/breakers/svc/open?key="+host, token, url.Values{"reason": {"failover drill 42"}}); code != 200 {
		t.Fatalf("force open: %d %s", code, body)
	}
	backend.hits.Store(0)
	if _, err := client.Get(ts.URL); !errors.Is(err, breaker.ErrOpen) {
		t.Errorf("a call after force-open: %v; want breaker.ErrOpen", err)
	}
	if n := backend.hits.Load(); n != 0 {
		t.Errorf("the backend saw %d calls through an open breaker", n)
	}
	mu.Lock()
	if !strings.Contains(logs.String(), "failover drill 42") {
		t.Errorf("the reason is not in the log:\n%s", logs.String())
	}
	mu.Unlock()

	// The listing shows it, with its settings.
	resp, err := http.Get(admin.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	var st listing
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, b := range st.Breakers {
		if b.Dependency == "svc" && b.Key == host {
			found = true
			if b.State != "open" || !b.Forced || b.Settings["min_requests"] != float64(5) {
				t.Errorf("listing of the forced breaker: %+v", b)
			}
		}
	}
	for _, b := range st.Budgets {
		if b.Dependency == "svc" && (b.Settings["ratio"] != 0.5 || b.Max != 100 || b.Tokens > 100) {
			t.Errorf("svc budget %+v; want ratio 0.5, max 100", b)
		}
	}
	if !found || len(st.Budgets) != 3 || len(st.Shedders) != 1 || len(st.Bulkheads) != 1 {
		t.Errorf("listing %+v; want the svc breaker, 3 budgets, 1 shedder, 1 bulkhead", st)
	}

	// A reload that leaves the breaker settings alone keeps it open.
	if err := reg.ReloadBytes([]byte(strings.Replace(testFile, "attempt_timeout: 2s", "attempt_timeout: 3s", 1))); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(ts.URL); !errors.Is(err, breaker.ErrOpen) {
		t.Errorf("a call after a reload: %v; want the breaker still open", err)
	}
	if code, body := post("/breakers/svc/reset", token, url.Values{"reason": {"drill over"}}); code != 200 {
		t.Fatalf("reset: %d %s", code, body)
	}
	if code, err := get(t, client, ts.URL); err != nil || code != 200 {
		t.Errorf("a call after reset: %d, %v; want 200", code, err)
	}

	// A policy dependency's breaker.
	if code, body := post("/breakers/ledger/open", token, url.Values{"reason": {"ledger maintenance"}}); code != 200 {
		t.Fatalf("force open ledger: %d %s", code, body)
	}
	ledger, _ := reg.Policy("ledger")
	if _, err := do(context.Background(), ledger, func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, breaker.ErrOpen) {
		t.Errorf("a ledger call after force-open: %v; want breaker.ErrOpen", err)
	}
}

// adminPost sends a POST to the admin endpoint at base, with the given
// headers (a "Host" entry sets the Host header), and returns the status
// and body.
func adminPost(t *testing.T, base, path, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Error string }
	if resp.StatusCode != http.StatusOK && json.Unmarshal(b, &e) == nil && e.Error != "" {
		return resp.StatusCode, e.Error // the message, without JSON's escapes
	}
	return resp.StatusCode, string(b)
}

// allowAll is an Authorize hook that lets every write through, so that
// only the guard stands in front of the endpoint.
func allowAll(*http.Request) error { return nil }

// A web page an operator visits cannot drive the endpoint through the
// operator's browser: cross-site writes, simple-type bodies and foreign
// Host names (DNS rebinding) are refused before the endpoint acts, even
// with an Authorize hook that would let them through.
func TestAdminRefusesCrossSiteRequests(t *testing.T) {
	reg := quietRegistry(t, testFile)
	a, err := NewAdmin(reg, AdminConfig{Authorize: allowAll, Hosts: []string{"ops.example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, a)
	ledger, _ := reg.Policy("ledger")
	for _, tc := range []struct {
		name string
		path string
		body string
		hdr  map[string]string
		want int
	}{
		{"cross-site text/plain", "/breakers/ledger/open", "reason=pwned", map[string]string{"Content-Type": "text/plain", "Origin": "https://evil.example"}, http.StatusUnsupportedMediaType},
		{"cross-site text/plain, query", "/breakers/ledger/open?reason=pwned", "x", map[string]string{"Content-Type": "text/plain", "Origin": "https://evil.example"}, http.StatusUnsupportedMediaType},
		{"cross-site form", "/breakers/ledger/open", "reason=pwned", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType},
		{"cross-site JSON by Origin", "/breakers/ledger/open", `{"reason":"pwned"}`, map[string]string{"Content-Type": "application/json", "Origin": "https://evil.example"}, http.StatusForbidden},
		{"cross-site by Sec-Fetch-Site", "/breakers/ledger/open?reason=pwned", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"cross-site text/plain to a rebound Host", "/breakers/ledger/open?reason=pwned", "reason=pwned", map[string]string{"Content-Type": "text/plain", "Origin": "https://evil.example", "Host": "evil.example"}, http.StatusForbidden},
		{"rebound Host", "/breakers/ledger/open?reason=pwned", "", map[string]string{"Host": "evil.example"}, http.StatusForbidden},
		{"rebound Host, JSON", "/breakers/ledger/open", `{"reason":"pwned"}`, map[string]string{"Host": "evil.example", "Content-Type": "application/json"}, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, body := adminPost(t, srv.URL, tc.path, tc.body, tc.hdr); code != tc.want {
				t.Errorf("status %d (%s); want %d", code, body, tc.want)
			}
			if st := ledger.Policy().Breaker.State(); st != breaker.Closed {
				t.Fatalf("ledger's breaker is %v after the refused request; want closed", st)
			}
		})
	}
	// A rebound Host cannot read the listing either.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.Host = "evil.example"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("GET / with Host: evil.example: %d; want 403", resp.StatusCode)
	}
	// What programs send passes: a JSON body, a query, a listed Host.
	for _, hdr := range []map[string]string{
		{"Content-Type": "application/json"},
		{"Content-Type": "application/json", "Host": "ops.example.com:9901"},
		{"Content-Type": "application/json", "Origin": srv.URL},
	} {
		ledger.Policy().Breaker.Reset()
		if code, body := adminPost(t, srv.URL, "/breakers/ledger/open", `{"reason":"drill"}`, hdr); code != http.StatusOK {
			t.Errorf("a JSON write with %v: %d %s; want 200", hdr, code, body)
		}
		if st := ledger.Policy().Breaker.State(); st != breaker.Open {
			t.Errorf("ledger's breaker is %v after a JSON write with %v; want open", st, hdr)
		}
	}
}

func TestNewAdminNamesEveryInvalidField(t *testing.T) {
	reg := quietRegistry(t, testFile)
	_, err := NewAdmin(reg, AdminConfig{Hosts: []string{"ops.example.com", "http://x/", "a b"}})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("NewAdmin: %v; want ErrInvalidConfig", err)
	}
	for _, want := range []string{"AdminConfig.Authorize is nil", `AdminConfig.Hosts[1] is "http://x/"`, `AdminConfig.Hosts[2] is "a b"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("NewAdmin: %v; want it to name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "Hosts[0]") {
		t.Errorf("NewAdmin: %v; Hosts[0] is valid", err)
	}
}

// The caller of a refused write or read is told "forbidden", never the
// hook's error, which may say what a valid credential looks like; the
// error goes to the log.
func TestAdminDoesNotEchoAuthorizeError(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	reg, err := New("policy.yaml", []byte(testFile), Options{Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	const secret = "want a token starting sk_live_4f"
	deny := func(*http.Request) error { return errors.New(secret) }
	a, err := NewAdmin(reg, AdminConfig{Authorize: deny, AuthorizeRead: deny})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, a)
	code, body := adminPost(t, srv.URL, "/breakers/ledger/open?reason=drill", "", nil)
	if code != http.StatusForbidden || body != "forbidden" {
		t.Errorf("refused write: %d %s; want 403 forbidden, without the hook's error", code, body)
	}
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || strings.Contains(string(b), "sk_live") {
		t.Errorf("refused read: %d %s; want 403 forbidden, without the hook's error", resp.StatusCode, b)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "sk_live_4f"); n != 2 {
		t.Errorf("the log holds the hook's error %d times; want 2 (one write, one read):\n%s", n, logs.String())
	}
}

// breakerKeys returns the keys of the breakers the HTTP dependency name
// holds now.
func breakerKeys(t *testing.T, reg *Registry, name string) []string {
	t.Helper()
	cfg, _, err := reg.HTTPConfig(name)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	cfg.Breakers.Range(func(k string, _ *breaker.Breaker) bool {
		keys = append(keys, k)
		return true
	})
	return keys
}

// An action on a breaker that carries no traffic is an error naming what
// exists, and makes no breaker: forcing open a key no call uses would
// report a success that protects nothing.
func TestAdminActsOnlyOnExistingBreakers(t *testing.T) {
	reg := quietRegistry(t, testFile)
	a, err := NewAdmin(reg, AdminConfig{Authorize: allowAll})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, a)
	backend := &counting{}
	ts := newServer(t, backend)
	client, _ := reg.HTTPClient("svc")
	if code, err := get(t, client, ts.URL); err != nil || code != 200 {
		t.Fatal(code, err)
	}
	host := strings.TrimPrefix(ts.URL, "http://") // 127.0.0.1:port, the key of the call
	_, port, _ := strings.Cut(host, ":")
	for _, key := range []string{"127.0.0.1", "127.0.0.1:443", "LOCALHOST:" + port, "payments.internal", "x\x1b[2J"} {
		code, body := adminPost(t, srv.URL, "/breakers/svc/open?reason=drill&key="+url.QueryEscape(key), "", nil)
		if code != http.StatusNotFound || !strings.Contains(body, strconv.Quote(host)) {
			t.Errorf("force open key %q: %d %s; want 404 naming the existing key %q", key, code, body, host)
		}
		if strings.Contains(body, "\x1b") {
			t.Errorf("force open key %q: the answer echoes a raw control character: %q", key, body)
		}
	}
	if keys := breakerKeys(t, reg, "svc"); len(keys) != 1 || keys[0] != host {
		t.Errorf("svc's breakers after the refused actions: %q; want only %q", keys, host)
	}
	backend.hits.Store(0)
	if code, err := get(t, client, ts.URL); err != nil || code != 200 || backend.hits.Load() != 1 {
		t.Errorf("a call after the refused actions: %d, %v, %d hits; want 200 and one hit", code, err, backend.hits.Load())
	}
	// A dependency that carried no traffic has no breaker to act on.
	code, body := adminPost(t, srv.URL, "/breakers/other/open?reason=drill", "", nil)
	if code != http.StatusNotFound || !strings.Contains(body, `has no breakers`) {
		t.Errorf("force open a dependency without traffic: %d %s; want 404, no breakers", code, body)
	}
	if keys := breakerKeys(t, reg, "other"); len(keys) != 0 {
		t.Errorf("other's breakers after the refused action: %q; want none", keys)
	}
	// An unknown dependency names the existing ones.
	code, body = adminPost(t, srv.URL, "/breakers/payments/open?reason=drill", "", nil)
	if code != http.StatusNotFound || !strings.Contains(body, `"ledger", "other", "svc"`) {
		t.Errorf("an unknown dependency: %d %s; want 404 naming ledger, other and svc", code, body)
	}
	// A policy dependency's one breaker has no key.
	code, body = adminPost(t, srv.URL, "/breakers/ledger/open?reason=drill&key=x", "", nil)
	if p, _ := reg.Policy("ledger"); code != http.StatusNotFound || p.Policy().Breaker.State() != breaker.Closed {
		t.Errorf("force open ledger with a key: %d %s, breaker %v; want 404 and closed", code, body, p.Policy().Breaker.State())
	}
	// The existing key works, and the next call is refused.
	if code, body := adminPost(t, srv.URL, "/breakers/svc/open?reason=drill&key="+url.QueryEscape(host), "", nil); code != http.StatusOK {
		t.Fatalf("force open %q: %d %s", host, code, body)
	}
	backend.hits.Store(0)
	if _, err := client.Get(ts.URL); !errors.Is(err, breaker.ErrOpen) || backend.hits.Load() != 0 {
		t.Errorf("a call after force-open: %v, %d hits; want breaker.ErrOpen and none", err, backend.hits.Load())
	}
}

// After a reload the endpoint acts on the values in force: the new
// breaker group of a dependency whose breaker settings changed, and the
// breaker of the kind a dependency has now.
func TestAdminActsOnLiveValuesAfterReload(t *testing.T) {
	reg := quietRegistry(t, testFile)
	a, err := NewAdmin(reg, AdminConfig{Authorize: allowAll})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, a)
	backend := &counting{}
	ts := newServer(t, backend)
	host := strings.TrimPrefix(ts.URL, "http://")
	client, _ := reg.HTTPClient("svc")
	if code, err := get(t, client, ts.URL); err != nil || code != 200 {
		t.Fatal(code, err)
	}
	oldCfg, _, _ := reg.HTTPConfig("svc")
	old := oldCfg.Breakers

	// New breaker settings: a new group, which no call has used yet.
	if err := reg.ReloadBytes([]byte(strings.Replace(testFile, "failure_rate: 0.9}", "failure_rate: 0.8}", 1))); err != nil {
		t.Fatal(err)
	}
	if code, body := adminPost(t, srv.URL, "/breakers/svc/open?reason=drill", "", nil); code != http.StatusNotFound {
		t.Errorf("force open svc before a call under the new settings: %d %s; want 404", code, body)
	}
	if code, err := get(t, client, ts.URL); err != nil || code != 200 {
		t.Fatal(code, err)
	}
	if code, body := adminPost(t, srv.URL, "/breakers/svc/open?reason=drill", "", nil); code != http.StatusOK || !strings.Contains(body, strconv.Quote(host)) {
		t.Fatalf("force open svc: %d %s; want 200 and its breaker", code, body)
	}
	backend.hits.Store(0)
	if _, err := client.Get(ts.URL); !errors.Is(err, breaker.ErrOpen) || backend.hits.Load() != 0 {
		t.Errorf("a call after force-open: %v, %d hits; want breaker.ErrOpen and none", err, backend.hits.Load())
	}
	if st := old.Get(host).State(); st != breaker.Closed {
		t.Errorf("the old group's breaker is %v; want it left alone", st)
	}

	// svc becomes a policy dependency: its breaker is the policy's.
	policyFile := strings.Replace(testFile, "  svc:\n", "  svc:\n    kind: policy\n", 1)
	policyFile = strings.Replace(policyFile, "    response_header_timeout: 1s\n", "", 1)
	if err := reg.ReloadBytes([]byte(policyFile)); err != nil {
		t.Fatal(err)
	}
	cur, _, _ := reg.HTTPConfig("svc")
	cur.Breakers.Get(host).Reset()
	if code, body := adminPost(t, srv.URL, "/breakers/svc/open?reason=drill", "", nil); code != http.StatusOK {
		t.Fatalf("force open svc as a policy: %d %s", code, body)
	}
	p, err := reg.Policy("svc")
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Policy().Breaker.State(); st != breaker.Open {
		t.Errorf("svc's policy breaker is %v; want open", st)
	}
	if st := cur.Breakers.Get(host).State(); st != breaker.Closed {
		t.Errorf("the old HTTP breaker of svc is %v; want it left alone", st)
	}
}

// FuzzAdminAction: whatever path, query, headers and body a caller sends,
// the endpoint answers one of its documented codes, never panics, never
// makes a breaker, and changes a breaker only when it answers 200.
func FuzzAdminAction(f *testing.F) {
	f.Add("ledger", "open", "reason=drill", "application/json", `{"reason":"drill"}`, "")
	f.Add("svc", "open", "key=127.0.0.1:1&reason=x", "", "", "")
	f.Add("svc", "reset", "", "application/json", `{"key":"127.0.0.1:1","reason":"r"}`, "")
	f.Add("ledger", "close", "reason=x", "text/plain", "reason=x", "https://evil.example")
	f.Add("nope", "open", "reason=%00", "application/json; charset=utf-8", `{"reason":"`+strings.Repeat("x", 600)+`"}`, "")
	f.Add("ledger", "open", "", "application/json", `{"reason": 1}`, "")
	f.Add("ledger", "open", "", "application/problem+json", `{"reason":"x","extra":true}`, "null")
	f.Fuzz(func(t *testing.T, dep, action, query, ctype, body, origin string) {
		reg := quietRegistry(t, testFile)
		cfg, _, _ := reg.HTTPConfig("svc")
		cfg.Breakers.Get("127.0.0.1:1") // a host a call used
		a, err := NewAdmin(reg, AdminConfig{Authorize: allowAll})
		if err != nil {
			t.Fatal(err)
		}
		target := "/breakers/" + url.PathEscape(dep) + "/" + url.PathEscape(action) + "?" + query
		req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:9901"+target, strings.NewReader(body))
		if err != nil {
			return // not a request a client can send
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound,
			http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType, http.StatusMovedPermanently, http.StatusTemporaryRedirect:
		default:
			t.Fatalf("%s: answered %d %s", target, rec.Code, rec.Body)
		}
		if keys := breakerKeys(t, reg, "svc"); len(keys) != 1 {
			t.Fatalf("%s: svc holds breakers %q after the action; want only the one a call made", target, keys)
		}
		if keys := breakerKeys(t, reg, "other"); len(keys) != 0 {
			t.Fatalf("%s: other holds breakers %q; want none", target, keys)
		}
		changed := cfg.Breakers.Get("127.0.0.1:1").Metrics().Forced
		p, _ := reg.Policy("ledger")
		changed = changed || p.Policy().Breaker.Metrics().Forced
		if changed && rec.Code != http.StatusOK {
			t.Fatalf("%s: a breaker changed, and the answer was %d", target, rec.Code)
		}
	})
}

// The error of an unknown key names at most 20 of the keys that exist.
func TestAdminNotFoundListsSomeKeys(t *testing.T) {
	reg := quietRegistry(t, testFile)
	cfg, _, _ := reg.HTTPConfig("svc")
	for i := range 25 {
		cfg.Breakers.Get(fmt.Sprintf("h%02d.internal:443", i))
	}
	a, err := NewAdmin(reg, AdminConfig{Authorize: allowAll})
	if err != nil {
		t.Fatal(err)
	}
	code, body := adminPost(t, newServer(t, a).URL, "/breakers/svc/open?reason=drill&key=nope", "", nil)
	if code != http.StatusNotFound || !strings.Contains(body, `"h19.internal:443" and 5 more`) || strings.Contains(body, "h20") {
		t.Errorf("unknown key among 25: %d %s; want 404 naming h00 to h19 and 5 more", code, body)
	}
}
