package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/extra/pgstore"
	"github.com/guardrail-go/guardrail/extra/redisstore"
	"github.com/guardrail-go/guardrail/fault"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

type idemParams struct {
	payments int
	loss     float64
	store    string
	redis    string
	postgres string
}

func idempotencyExp() Experiment {
	return bound(Experiment{
		Name:    "idempotency",
		Light:   true,
		Summary: "POST /payments whose response is lost after commit, retried with and without an Idempotency-Key: count the charges",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := idemParams{payments: 200, loss: 0.3, store: "memory", redis: "127.0.0.1:6379",
				postgres: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"}
			if quick {
				p.payments = 60
			}
			fs.IntVar(&p.payments, "payments", p.payments, "payments each row makes")
			fs.Float64Var(&p.loss, "loss", p.loss, "probability that the server commits and then loses the response")
			fs.StringVar(&p.store, "store", p.store, "where keys live: memory, redis or postgres")
			fs.StringVar(&p.redis, "redis", p.redis, "Redis address for --store redis")
			fs.StringVar(&p.postgres, "postgres", p.postgres, "PostgreSQL DSN for --store postgres")
			return &p
		},
	})
}

func (p idemParams) newStore(ctx context.Context) (idempotency.Store, func(), error) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	tag := hex.EncodeToString(suffix)
	switch p.store {
	case "memory":
		s, err := memstore.New(memstore.Config{})
		return s, func() {}, err
	case "redis":
		c := redis.NewClient(&redis.Options{Addr: p.redis, MaxRetries: 1, DialTimeout: time.Second})
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close()
			return nil, nil, fmt.Errorf("redis at %s: %w", p.redis, err)
		}
		s, err := redisstore.New(c, redisstore.Config{Prefix: "guardrail-lab:" + tag + ":"})
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		return s, func() { c.Close() }, nil
	case "postgres":
		pool, err := pgxpool.New(ctx, p.postgres)
		if err == nil {
			err = pool.Ping(ctx)
		}
		if err != nil {
			if pool != nil {
				pool.Close()
			}
			return nil, nil, fmt.Errorf("postgres at %s: %w", p.postgres, err)
		}
		table := "guardrail_lab_" + tag
		s, err := pgstore.New(pool, pgstore.Config{Table: table})
		if err == nil {
			err = s.Migrate(ctx)
		}
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, func() {
			_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table)
			pool.Close()
		}, nil
	}
	return nil, nil, flagErrorf("--store must be memory, redis or postgres, not %q", p.store)
}

// checkFlags reports every flag the experiment cannot run with.
func (p idemParams) checkFlags() error {
	var c flagCheck
	// Every payment of a keyed row leaves its key in the store: at most
	// memstore's default capacity, so that the row measures keys, not a
	// full store.
	within(&c, "payments", p.payments, closed(1, memstore.DefaultMaxEntries))
	if !(p.loss >= 0 && p.loss < 1) { // also NaN
		c.failf("--loss must be in [0, 1)")
	}
	switch p.store {
	case "memory", "redis", "postgres":
	default:
		c.failf("--store must be memory, redis or postgres, not %q", p.store)
	}
	return c.err()
}

func (p idemParams) run(ctx context.Context, env *Env) (*Result, error) {
	r := &Result{Experiment: "idempotency", Title: fmt.Sprintf("POST /payments, %.0f%% of responses lost after commit, keys in %s: charges with and without an Idempotency-Key", p.loss*100, p.store)}
	rows := []struct {
		label  string
		key    bool
		retry  bool
		inside bool // the connection is cut inside the idempotency middleware
	}{
		{"no key, a helper that retries anyway", false, true, false},
		{"no key, guardhttp (POST is not idempotent)", false, false, false},
		{"guardhttp attaching an Idempotency-Key", true, true, false},
		{"the same, connection cut inside the middleware", true, true, true},
	}
	for i, row := range rows {
		env.Progress("idempotency: row %d/%d", i+1, len(rows))
		store, closeStore, err := p.newStore(ctx)
		if err != nil {
			return nil, err
		}
		res, err := p.row(ctx, env, store, row.key, row.retry, row.inside)
		closeStore()
		if err != nil {
			return nil, err
		}
		r.add(row.label, Int("payments", p.payments), Int("charges", res.charges), Int("lost_responses", res.lost),
			Int("client_errors", res.errors), Int("replayed", res.replayed), Int("unknown_outcomes", res.unknown))
		switch {
		case row.inside:
			// The middleware saw the connection taken over: it cannot know
			// whether the charge happened, so the retries are told so.
			r.check(res.charges == p.payments && res.unknown <= res.lost && res.replayed == 0, "a cut inside the middleware is an unknown outcome, not a second charge",
				"%d charges for %d payments; %d of %d lost answers reported as unknown outcomes to the retry",
				res.charges, p.payments, res.unknown, res.lost)
		case row.key:
			// A caller errs only when all its attempts lost their answer.
			allLost := float64(p.payments) * math.Pow(p.loss, attempts)
			r.check(res.charges == p.payments && float64(res.errors) <= 3*allLost+2, "a key makes retries safe",
				"%d charges for %d payments; %d answers replayed; %s lost all %d answers (expected about %.1f)",
				res.charges, p.payments, res.replayed, plural(res.errors, "caller"), attempts, allLost)
		case row.retry:
			r.check(res.charges > p.payments || res.lost == 0, "blind retries charge twice",
				"%d charges for %d payments (%d responses lost)", res.charges, p.payments, res.lost)
		default:
			r.check(res.charges == p.payments && res.errors == res.lost, "no key, no retry",
				"%d charges for %d payments; %s left not knowing (lost %d)", res.charges, p.payments, plural(res.errors, "caller"), res.lost)
		}
	}
	r.note("The server commits the charge, then the connection is cut before the answer (fault: lose_response).")
	r.note("Without a key the caller cannot tell a lost answer from a failed charge: guardrail does not retry it")
	r.note("(it ends with ErrOutcomeUnknown: the charge may have happened); with a key the retry gets the stored answer.")
	r.note("Cut inside the middleware, the connection is hijacked under it: the outcome is unknown, and the retry")
	r.note("gets a replayed 500 saying so, instead of running the handler (and the charge) again.")
	return r, nil
}

// attempts is the client's MaxAttempts in every row.
const attempts = 4

type idemOut struct{ charges, lost, errors, replayed, unknown int }

func (p idemParams) row(ctx context.Context, env *Env, store idempotency.Store, withKey, retry, inside bool) (idemOut, error) {
	var charges atomic.Int64
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"charge":%d,"for":%s}`, n, body)
	})
	inj, err := fault.New(fault.Config{Rand: fault.NewRand(env.Seed),
		Rules: []fault.Rule{{Name: "lost-after-commit", Probability: p.loss, Fault: fault.LoseResponse{}}}})
	if err != nil {
		return idemOut{}, err
	}
	defer inj.Close()
	mux := http.NewServeMux()
	// One client makes every payment: one key scope is right.
	keys, err := idempotency.New(store, idempotency.Config{Name: "payments", SingleTenant: true,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return idemOut{}, err
	}
	var h http.Handler
	if inside {
		mux.Handle("POST /payments", keys.Middleware(inj.Middleware(pay)))
		h = mux
	} else {
		mux.Handle("POST /payments", keys.Middleware(pay))
		h = inj.Middleware(mux)
	}
	srv, err := serve(h)
	if err != nil {
		return idemOut{}, err
	}
	defer srv.Close()

	// Row 1 is a blind retry helper: any error, any method, retry.
	naive := newHTTPClient(true)
	naivePol := &guardrail.Policy{Name: "payments", Retry: guardrail.Retry{
		MaxAttempts: attempts,
		Budget:      budget.Unlimited(),
		Backoff:     backoff.FullJitter(time.Millisecond, 20*time.Millisecond),
	},
		Idempotent: true, Breaker: disabledBreaker()}
	// Rows 2 and 3 are guardhttp, which retries a POST only with a key; in
	// row 3 it attaches one per payment (the same on every attempt).
	client := guarded(true, guardhttp.Config{Name: "payments", Retry: guardrail.Retry{
		MaxAttempts: attempts,
		Budget:      budget.Unlimited(),
		Backoff:     backoff.FullJitter(time.Millisecond, 20*time.Millisecond),
	},
		IdempotencyKeys: withKey,
		Breakers:        noBreakers()})
	var unknown int
	send := func(ctx context.Context, c *http.Client, body []byte) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", bytes.NewReader(body))
		resp, err := c.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		replayed := resp.Header.Get(idempotency.HeaderReplayed) == "true"
		if resp.StatusCode == http.StatusInternalServerError && replayed {
			unknown++ // the key's outcome is unknown: the charge may have happened
			return false, statusError{resp.StatusCode}
		}
		if resp.StatusCode != http.StatusCreated {
			return false, guardrail.Transient(statusError{resp.StatusCode})
		}
		return replayed, nil
	}
	var out idemOut
	for i := range p.payments {
		body := []byte(`{"order":` + strconv.Itoa(i) + `,"amount":100}`)
		var replayed bool
		var err error
		if retry && !withKey {
			replayed, err = guardrail.Do(ctx, naivePol, func(ctx context.Context) (bool, error) { return send(ctx, naive, body) })
		} else {
			replayed, err = send(ctx, client, body)
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return out, ctx.Err()
		case err != nil:
			out.errors++
		case replayed:
			out.replayed++
		}
	}
	for _, c := range inj.Counters() {
		out.lost += int(c.Fired)
	}
	out.charges = int(charges.Load())
	out.unknown = unknown
	if errors.Is(ctx.Err(), context.Canceled) {
		return out, ctx.Err()
	}
	return out, nil
}
