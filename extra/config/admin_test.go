package config

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
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
	resp, err := http.PostForm(ts.URL+"/breakers/ledger/open", url.Values{"reason": {"x"}})
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
		req, _ := http.NewRequest(http.MethodPost, admin.URL+path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
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
