package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
	"github.com/guardrail-go/guardrail/idempotency/storetest"
)

// must returns v, and panics if err is not nil: for constructors given a
// Config known to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// outageStore fails every call while down, as a store cut off from its
// backend would; memory itself cannot go away.
type outageStore struct {
	*memstore.Store
	down atomic.Bool
}

func (o *outageStore) BeginScoped(ctx context.Context, scope, key string, fp idempotency.Fingerprint, lease time.Duration, maxKeys int) (idempotency.Result, error) {
	if o.down.Load() {
		return idempotency.Result{}, errDown
	}
	return o.Store.BeginScoped(ctx, scope, key, fp, lease, maxKeys)
}

var errDown = errors.New("store unreachable")

func (o *outageStore) Begin(ctx context.Context, key string, fp idempotency.Fingerprint, lease time.Duration) (idempotency.Result, error) {
	if o.down.Load() {
		return idempotency.Result{}, errDown
	}
	return o.Store.Begin(ctx, key, fp, lease)
}

func (o *outageStore) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	if o.down.Load() {
		return errDown
	}
	return o.Store.Complete(ctx, key, token, resp, ttl)
}

func (o *outageStore) Release(ctx context.Context, key, token string) error {
	if o.down.Load() {
		return errDown
	}
	return o.Store.Release(ctx, key, token)
}

func (o *outageStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if o.down.Load() {
		return errDown
	}
	return o.Store.Extend(ctx, key, token, lease)
}

func harness() storetest.Harness {
	return storetest.Harness{
		New: func(t *testing.T) storetest.Subject {
			o := &outageStore{Store: must(memstore.New(memstore.Config{}))}
			return storetest.Subject{
				Store:   o,
				Advance: time.Sleep, // inside the bubble: fake time, instant
				Down:    func() { o.down.Store(true) },
				Up:      func() { o.down.Store(false) },
			}
		},
		Bubble: synctest.Test,
	}
}

func TestConformance(t *testing.T) { storetest.Run(t, harness()) }

func TestHTTP(t *testing.T) { storetest.RunHTTP(t, harness()) }

func fp(b byte) idempotency.Fingerprint { return idempotency.Fingerprint{b} }

func TestMaxEntriesRefusesNewKeysUntilExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := must(memstore.New(memstore.Config{MaxEntries: 2}))
		ctx := t.Context()
		for _, k := range []string{"a", "b"} {
			res, err := s.Begin(ctx, k, fp(1), time.Minute)
			if err != nil || res.State != idempotency.StateAcquired {
				t.Fatalf("Begin(%s) = %v, %v", k, res.State, err)
			}
		}
		if _, err := s.Begin(ctx, "c", fp(1), time.Minute); !errors.Is(err, idempotency.ErrStoreFull) {
			t.Fatalf("third key: %v, want ErrStoreFull", err)
		}
		// Known keys still answer while full.
		if res, err := s.Begin(ctx, "a", fp(1), time.Minute); err != nil || res.State != idempotency.StateInFlight {
			t.Fatalf("known key while full: %v, %v", res.State, err)
		}
		time.Sleep(time.Minute)
		if got := s.Len(); got != 0 {
			t.Fatalf("Len after the leases ended = %d, want 0", got)
		}
		if res, err := s.Begin(ctx, "c", fp(1), time.Minute); err != nil || res.State != idempotency.StateAcquired {
			t.Fatalf("after expiry: %v, %v", res.State, err)
		}
	})
}

func TestMaxBytesKeepsCompletionWithoutBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := must(memstore.New(memstore.Config{MaxBytes: 4096}))
		ctx := t.Context()
		res, _ := s.Begin(ctx, "k", fp(1), time.Minute)
		big := &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/x/1"}}, Body: make([]byte, 8192)}
		if err := s.Complete(ctx, "k", res.Token, big, time.Hour); err != nil {
			t.Fatal(err)
		}
		got, _ := s.Begin(ctx, "k", fp(1), time.Minute)
		if got.State != idempotency.StateCompleted || !got.Response.BodyOmitted || len(got.Response.Body) != 0 ||
			got.Response.Status != http.StatusCreated || got.Response.Header.Get("Location") != "/x/1" {
			t.Fatalf("got %+v, want the completion kept without its body", got)
		}
		if b := s.Bytes(); b > 4096 {
			t.Errorf("Bytes = %d, over MaxBytes 4096", b)
		}
	})
}

func TestBytesAccounting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := must(memstore.New(memstore.Config{}))
		ctx := t.Context()
		res, _ := s.Begin(ctx, "k", fp(1), time.Minute)
		locked := s.Bytes()
		if locked <= 0 {
			t.Fatalf("Bytes with one lock = %d", locked)
		}
		s.Complete(ctx, "k", res.Token, &idempotency.Response{Status: 200, Body: make([]byte, 10000)}, time.Hour)
		if got := s.Bytes(); got < locked+10000 {
			t.Errorf("Bytes after storing 10000 bytes = %d, want >= %d", got, locked+10000)
		}
		res2, _ := s.Begin(ctx, "k2", fp(1), time.Minute)
		s.Release(ctx, "k2", res2.Token)
		time.Sleep(time.Hour)
		if got := s.Bytes(); got != 0 {
			t.Errorf("Bytes after everything expired = %d, want 0", got)
		}
	})
}

func TestNewRefusesNegativeLimits(t *testing.T) {
	for _, tt := range []struct {
		cfg  memstore.Config
		want string
	}{
		{memstore.Config{MaxEntries: -1}, "memstore: Config.MaxEntries is -1; want a positive count"},
		{memstore.Config{MaxBytes: -1}, "memstore: Config.MaxBytes is -1; want a positive size"},
	} {
		if _, err := memstore.New(tt.cfg); !errors.Is(err, memstore.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v): %v, want %q", tt.cfg, err, tt.want)
		}
	}
	if _, err := memstore.New(memstore.Config{}); err != nil {
		t.Errorf("New with a zero Config: %v", err)
	}
}

// TestBodiesLeaveRoomForNewKeys: one scope whose responses fill MaxBytes
// with bodies, down to the last byte it can, does not stop another scope
// from locking a new key: bodies never take the last eighth of MaxBytes.
// (They used to take all of it, and the other scope got ErrStoreFull.)
func TestBodiesLeaveRoomForNewKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxBytes = 64 << 10
		s := must(memstore.New(memstore.Config{MaxBytes: maxBytes}))
		ctx := t.Context()
		n := 0
		for _, size := range []int{8192, 1024, 128, 16, 1} {
			for {
				n++
				k := fmt.Sprintf("a%05d", n)
				res, err := s.BeginScoped(ctx, "scope-a", k, fp(1), time.Minute, -1)
				if err != nil {
					t.Fatalf("scope a, key %d: %v", n, err)
				}
				resp := &idempotency.Response{Status: http.StatusOK, Body: make([]byte, size)}
				if err := s.Complete(ctx, k, res.Token, resp, time.Hour); err != nil {
					t.Fatal(err)
				}
				if got, _ := s.Begin(ctx, k, fp(1), time.Minute); got.Response.BodyOmitted {
					break
				}
			}
		}
		if b := s.Bytes(); b > maxBytes {
			t.Errorf("Bytes = %d, over MaxBytes %d", b, maxBytes)
		}
		for i := range 10 {
			if _, err := s.BeginScoped(ctx, "scope-b", fmt.Sprintf("b%d", i), fp(1), time.Minute, -1); err != nil {
				t.Fatalf("scope b, key %d, after scope a filled the bodies: %v", i, err)
			}
		}
	})
}

// TestScopeFullRetryInFollowsTheScope: the Retry-After of a full scope is
// when its first key expires, and follows that key when it completes (its
// expiry moves to the TTL's end) or goes, however many refusals came
// before: the soonest expiry is cached between changes, not stale.
func TestScopeFullRetryInFollowsTheScope(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := must(memstore.New(memstore.Config{}))
		ctx := t.Context()
		retryIn := func() time.Duration {
			t.Helper()
			res, err := s.BeginScoped(ctx, "a", "new", fp(1), time.Minute, 2)
			if !errors.Is(err, idempotency.ErrScopeFull) {
				t.Fatalf("BeginScoped over the quota: %v", err)
			}
			return res.RetryIn
		}
		k1, _ := s.BeginScoped(ctx, "a", "k1", fp(1), time.Minute, 2)
		time.Sleep(10 * time.Second)
		k2, _ := s.BeginScoped(ctx, "a", "k2", fp(1), time.Minute, 2)
		for range 3 {
			if got := retryIn(); got != 50*time.Second {
				t.Fatalf("RetryIn = %v, want 50s (k1's lease)", got)
			}
		}
		if err := s.Complete(ctx, "k1", k1.Token, &idempotency.Response{Status: 201}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if got := retryIn(); got != time.Minute {
			t.Fatalf("after k1 completed: RetryIn = %v, want 1m (k2's lease)", got)
		}
		if err := s.Extend(ctx, "k2", k2.Token, 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		if got := retryIn(); got != time.Hour {
			t.Fatalf("after k2 was extended: RetryIn = %v, want 1h (k1's TTL)", got)
		}
	})
}

// BenchmarkBeginScopedOverQuota: a caller at a quota of 10,000 sending new
// keys, which every other caller's requests wait behind (one lock).
func BenchmarkBeginScopedOverQuota(b *testing.B) {
	s := must(memstore.New(memstore.Config{}))
	ctx := context.Background()
	for i := range 10_000 {
		if _, err := s.BeginScoped(ctx, "a", fmt.Sprint("k", i), fp(1), time.Hour, 10_000); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if _, err := s.BeginScoped(ctx, "a", "new", fp(1), time.Hour, 10_000); !errors.Is(err, idempotency.ErrScopeFull) {
			b.Fatal(err)
		}
	}
}
