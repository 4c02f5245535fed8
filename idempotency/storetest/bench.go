package storetest

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/idempotency"
)

// BenchmarkScopedBegin measures a new key on s (lock, then release)
// without a quota (Begin) and with one (BeginScoped, the caller holding
// 1,000 completed keys under a quota of 10,000): what the count per
// caller costs on that store. Each store's benchmark calls it with a
// store on its real backend.
func BenchmarkScopedBegin(b *testing.B, s idempotency.ScopedStore) {
	ctx := context.Background()
	fp := idempotency.Fingerprint{1}
	resp := &idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"id":"ch_1"}`)}
	prefix := idempotency.NewToken()[:8]
	n := 0
	newKey := func() string { n++; return prefix + strconv.Itoa(n) }
	scope := idempotency.NewToken()
	for range 1000 {
		k := newKey()
		res, err := s.BeginScoped(ctx, scope, k, fp, time.Minute, 10_000)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, k, res.Token, resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	for _, bb := range []struct {
		name  string
		begin func(k string) (idempotency.Result, error)
	}{
		{"Begin", func(k string) (idempotency.Result, error) { return s.Begin(ctx, k, fp, time.Minute) }},
		{"BeginScoped", func(k string) (idempotency.Result, error) {
			return s.BeginScoped(ctx, scope, k, fp, time.Minute, 10_000)
		}},
	} {
		b.Run(bb.name, func(b *testing.B) {
			for b.Loop() {
				k := newKey()
				res, err := bb.begin(k)
				if err != nil || res.State != idempotency.StateAcquired {
					b.Fatal(res.State, err)
				}
				// Released, so that the caller keeps holding 1,000 keys.
				if err := s.Release(ctx, k, res.Token); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
