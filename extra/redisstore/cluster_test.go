package redisstore_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/extra/redisstore"
	"github.com/guardrail-go/guardrail/extra/redisstore/internal/redistest"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/storetest"
)

// shared cluster; replicas is Config.Replicas.
func clusterHarness(replicas int) storetest.Harness {
	return storetest.Harness{New: func(t *testing.T) storetest.Subject {
		cl := redistest.Shared(t)
		client := cl.Client(t)
		prefix, keys := redistest.ClusterPrefix(t, client)
		return storetest.Subject{
			Store: mustNew(client, redisstore.Config{Prefix: prefix, Replicas: replicas}),
			Advance: func(d time.Duration) {
				for _, k := range keys() { // one key per script: keys live in different slots
					if err := advanceScript.Run(context.Background(), client, []string{k}, strconv.FormatInt(d.Milliseconds(), 10)).Err(); err != nil {
						t.Fatal(err)
					}
				}
			},
		}
	}}
}

func TestClusterConformance(t *testing.T) { storetest.Run(t, clusterHarness(0)) }

func TestClusterHTTP(t *testing.T) { storetest.RunHTTP(t, clusterHarness(0)) }

func TestClusterConformanceWaitReplica(t *testing.T) { storetest.Run(t, clusterHarness(1)) }

// Keys of one record hash to one slot: the store touches exactly one key
// per record, so there is nothing a hash tag would have to keep together.
// This checks that a record is one key, whatever the key's text.
func TestClusterOneKeyPerRecord(t *testing.T) {
	cl := redistest.Shared(t)
	client := cl.Client(t)
	prefix := "guardrail-test:" + idempotency.NewToken()[:12] + ":"
	s := mustNew(client, redisstore.Config{Prefix: prefix})
	ctx := t.Context()
	for _, key := range []string{"a", "{b}", "c{d}e", strings.Repeat("x", 200)} {
		res, err := s.Begin(ctx, key, idempotency.Fingerprint{1}, time.Minute)
		if err != nil || res.State != idempotency.StateAcquired {
			t.Fatalf("Begin(%q): %v %v", key, res.State, err)
		}
		if err := s.Complete(ctx, key, res.Token, &idempotency.Response{Status: 200}, time.Minute); err != nil {
			t.Fatalf("Complete(%q): %v", key, err)
		}
		var n atomic.Int64
		_ = client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			k, err := m.Keys(ctx, prefix+"*").Result()
			n.Add(int64(len(k)))
			for _, kk := range k {
				m.Del(ctx, kk)
			}
			return err
		})
		if n.Load() != 1 {
			t.Fatalf("record %q is %d keys, want 1", key, n.Load())
		}
	}
}

// TestClusterFailover kills a master mid-run and promotes its replica.
// With Config.Replicas 1, every lock and every stored response is on the
// replica before the store reports it, so no request runs its handler
// twice: requests in flight on the dead master get an error (and are
// retried by the client, with the same key) or a replay.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and fails over a Redis Cluster")
	}
	cl := redistest.StartCluster(t)
	defer cl.Stop()
	client := cl.Client(t)
	store := mustNew(client, redisstore.Config{Prefix: "failover:", Replicas: 1, ReplicaTimeout: 500 * time.Millisecond})

	var mu sync.Mutex
	runs := map[string]int{}
	h := middleware(store, idempotency.Config{Logger: slog.New(slog.DiscardHandler)})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idempotency.HeaderKey)
		mu.Lock()
		runs[key]++
		n := runs[key]
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, key+" run "+strconv.Itoa(n))
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	hc := srv.Client()

	const keys, workers = 400, 8
	begun := time.Now()
	var done, errorsSeen, replays atomic.Int64
	killAt := make(chan struct{})
	var killOnce sync.Once
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < keys; i += workers {
				key := "pay-" + strconv.Itoa(i)
				for attempt := 0; ; attempt++ {
					// A margin, not a schedule: the failover and the old
					// master's return take seconds on a quiet machine and
					// tens of seconds on a loaded one; a key that gets no
					// answer in two minutes is a hang.
					if time.Since(begun) > 2*time.Minute {
						t.Errorf("%s: no answer after %d attempts in %v", key, attempt, time.Since(begun))
						return
					}
					req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(`{"amount":1}`))
					req.Header.Set(idempotency.HeaderKey, key)
					resp, err := hc.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusCreated {
						if string(body) != key+" run 1" {
							t.Errorf("%s: answer %q, want the first run's", key, body)
						}
						if resp.Header.Get(idempotency.HeaderReplayed) == "true" {
							replays.Add(1)
						}
						break
					}
					errorsSeen.Add(1)
					time.Sleep(20 * time.Millisecond) // the client's retry backoff
				}
				if done.Add(1) == keys/4 {
					killOnce.Do(func() { close(killAt) })
				}
			}
		})
	}

	<-killAt
	// Kill one master; force its replica to take over.
	ctx := context.Background()
	var victim, heir int = -1, -1
	for i, a := range cl.Addrs() {
		n := redis.NewClient(&redis.Options{Addr: a})
		repl := n.Info(ctx, "replication").Val()
		n.Close()
		if victim < 0 && strings.Contains(repl, "role:master") {
			victim = i
		}
	}
	for i, a := range cl.Addrs() {
		n := redis.NewClient(&redis.Options{Addr: a})
		repl := n.Info(ctx, "replication").Val()
		n.Close()
		if strings.Contains(repl, "master_port:"+cl.Port(victim)+"\r\n") {
			heir = i
		}
	}
	if heir < 0 {
		t.Fatalf("no replica of the master on port %s", cl.Port(victim))
	}
	cl.Kill(victim)
	n := redis.NewClient(&redis.Options{Addr: cl.Addrs()[heir]})
	defer n.Close()
	if err := n.Do(ctx, "CLUSTER", "FAILOVER", "FORCE").Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER FORCE: %v", err)
	}
	redistest.WaitFor(t, "the replica to be promoted", func() bool {
		return strings.Contains(n.Info(ctx, "replication").Val(), "role:master")
	})
	// The promoted master has no replica: with Replicas 1 its writes fail
	// (503, retried by the clients) until the old master, restarted,
	// rejoins as its replica.
	cl.StartNode(t, victim)
	cl.WaitHealthy(t)
	wg.Wait()

	dups := 0
	for key, r := range runs {
		if r != 1 {
			dups++
			t.Errorf("%s ran %d times", key, r)
		}
	}
	t.Logf("%d keys, %d duplicate runs, %d error answers retried by the clients, %d replays", len(runs), dups, errorsSeen.Load(), replays.Load())
	if len(runs) != keys {
		t.Fatalf("%d keys ran, want %d", len(runs), keys)
	}
}
