package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

// countingStore passes calls to a store and counts Complete and Release.
type countingStore struct {
	idempotency.Store
	mu                  sync.Mutex
	completes, releases int
	stored              []int // the statuses Complete stored
}

func (c *countingStore) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	c.mu.Lock()
	c.completes++
	c.stored = append(c.stored, resp.Status)
	c.mu.Unlock()
	return c.Store.Complete(ctx, key, token, resp, ttl)
}

func (c *countingStore) Release(ctx context.Context, key, token string) error {
	c.mu.Lock()
	c.releases++
	c.mu.Unlock()
	return c.Store.Release(ctx, key, token)
}

func newKeys(t *testing.T, s idempotency.Store, cfg idempotency.KeysConfig) *idempotency.Keys {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	k, err := idempotency.NewKeys(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func begin(t *testing.T, k *idempotency.Keys, key string) (idempotency.Result, *idempotency.Session) {
	t.Helper()
	res, sess, err := k.Begin(t.Context(), idempotency.Request{Scope: []string{"tenant", "op"}, Key: key, Fingerprint: idempotency.Fingerprint{1}})
	if err != nil {
		t.Fatal(err)
	}
	if (sess != nil) != (res.State == idempotency.StateAcquired) {
		t.Fatalf("Begin: state %v with session %v; want a session exactly when acquired", res.State, sess != nil)
	}
	return res, sess
}

func TestNewKeysReportsEveryInvalidField(t *testing.T) {
	_, err := idempotency.NewKeys(must(memstore.New(memstore.Config{})), idempotency.KeysConfig{TTL: -1, Lease: -1, StoreTimeout: -1})
	if !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("NewKeys: %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"KeysConfig.TTL is -1ns", "KeysConfig.Lease is -1ns", "KeysConfig.StoreTimeout is -1ns"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := idempotency.NewKeys(nil, idempotency.KeysConfig{}); err == nil {
		t.Error("NewKeys accepted a nil Store")
	}
}

// A session ends once: the first of Complete, Release and Unknown decides,
// and the others change nothing on the store.
func TestSessionEndsOnce(t *testing.T) {
	s := &countingStore{Store: must(memstore.New(memstore.Config{}))}
	k := newKeys(t, s, idempotency.KeysConfig{})
	_, sess := begin(t, k, "once")
	sess.Complete(&idempotency.Response{Status: http.StatusCreated, Body: []byte("done")})
	sess.Release("too late")
	sess.Unknown(&idempotency.Response{Status: 500}, "too late")
	sess.Complete(&idempotency.Response{Status: http.StatusOK})
	if s.completes != 1 || s.releases != 0 {
		t.Fatalf("%d completes, %d releases; want the first Complete only", s.completes, s.releases)
	}
	res, _ := begin(t, k, "once")
	if res.State != idempotency.StateCompleted || string(res.Response.Body) != "done" {
		t.Fatalf("Begin after: %v %v, want the first answer stored", res.State, res.Response)
	}
	if err := idempotency.Held(sess.Context()); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("Held after the session ended: %v, want ErrLeaseLost", err)
	}
}

// Complete applies the one table: the answers that say "not processed"
// release the key; Unknown stores its answer whatever its status; Release
// in the session's context turns Complete into a release.
func TestSessionEnds(t *testing.T) {
	s := &countingStore{Store: must(memstore.New(memstore.Config{}))}
	var mu sync.Mutex
	reasons := map[string]int{}
	obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		mu.Lock()
		reasons[e.Operation+" "+e.Reason]++
		mu.Unlock()
		return ctx
	})
	k := newKeys(t, s, idempotency.KeysConfig{Observer: obs})
	tests := []struct {
		name     string
		end      func(*idempotency.Session)
		released bool
	}{
		{"429", func(s *idempotency.Session) { s.Complete(&idempotency.Response{Status: http.StatusTooManyRequests}) }, true},
		{"425", func(s *idempotency.Session) { s.Complete(&idempotency.Response{Status: http.StatusTooEarly}) }, true},
		{"503", func(s *idempotency.Session) { s.Complete(&idempotency.Response{Status: http.StatusServiceUnavailable}) }, true},
		{"404", func(s *idempotency.Session) { s.Complete(&idempotency.Response{Status: http.StatusNotFound}) }, false},
		{"unknown", func(s *idempotency.Session) {
			s.Unknown(&idempotency.Response{Status: http.StatusInternalServerError}, "panic")
		}, false},
		{"handler released", func(s *idempotency.Session) {
			if err := idempotency.Release(s.Context()); err != nil {
				t.Fatal(err)
			}
			s.Complete(&idempotency.Response{Status: http.StatusCreated})
		}, true},
		{"release", func(s *idempotency.Session) { s.Release("nothing committed") }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, sess := begin(t, k, tt.name)
			tt.end(sess)
			res, again := begin(t, k, tt.name)
			if tt.released != (res.State == idempotency.StateAcquired) {
				t.Errorf("Begin after: %v, want released %v", res.State, tt.released)
			}
			if again != nil {
				again.Release("test over")
			}
		})
	}
	if s.releases != 5+5 { // five released ends, and the five sessions they let begin again
		t.Errorf("%d releases, want 10", s.releases)
	}
	if n := reasons[" "+event.ReasonOutcomeUnknown]; n != 1 {
		t.Errorf("%d outcome_unknown events, want 1; events %v", n, reasons)
	}
}

// The events of a session carry Request.Operation, or the context's.
func TestKeysEventsOperation(t *testing.T) {
	var mu sync.Mutex
	var ops []string
	obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		mu.Lock()
		ops = append(ops, e.Dependency+"|"+e.Operation+"|"+e.Reason)
		mu.Unlock()
		return ctx
	})
	k := newKeys(t, must(memstore.New(memstore.Config{})), idempotency.KeysConfig{Name: "orders", Observer: obs})
	_, sess, err := k.Begin(t.Context(), idempotency.Request{Key: "k", Operation: "orders.place"})
	if err != nil {
		t.Fatal(err)
	}
	sess.Complete(&idempotency.Response{Status: http.StatusCreated})
	if _, _, err := k.Begin(event.WithOperation(t.Context(), "from ctx"), idempotency.Request{Key: "k"}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"orders|orders.place|stored", "orders|from ctx|replayed"}; strings.Join(ops, ",") != strings.Join(want, ",") {
		t.Errorf("events %q, want %q", ops, want)
	}
}
