package redisstore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/extra/redisstore"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/storetest"
)

// envClusterRequired, when set, turns the cluster tests' skip (no
// redis-server on PATH) into a failure, so CI cannot pass without them.
const envClusterRequired = "GUARDRAIL_TEST_REDIS_CLUSTER_REQUIRED"

// redisCluster is a Redis Cluster of the test's own: three masters and
// three replicas on loopback ports, each node a redis-server process.
type redisCluster struct {
	bin, dir string
	ports    []string
	procs    []*exec.Cmd
}

// startNode starts node i, or restarts it: it keeps its nodes file, so a
// restarted node rejoins the cluster with its identity.
func (c *redisCluster) startNode(tb testing.TB, i int) {
	tb.Helper()
	if !c.tryNode(tb, i) {
		tb.Fatalf("node 127.0.0.1:%s could not listen: its port was taken", c.ports[i])
	}
}

// tryNode starts node i and waits until it answers; it reports false,
// at once, when the node could not bind its port, which another process
// may take between freePort's check and the node's start.
func (c *redisCluster) tryNode(tb testing.TB, i int) bool {
	tb.Helper()
	port := c.ports[i]
	log, err := os.OpenFile(filepath.Join(c.dir, port+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(c.bin, "--port", port, "--bind", "127.0.0.1", "--dir", c.dir,
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+port+".conf",
		"--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no")
	cmd.Stdout, cmd.Stderr = log, log // a file, not a pipe: no goroutine copies it
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c.procs[i] = cmd
	a := "127.0.0.1:" + port
	bound := true
	waitFor(tb, "node "+a+" to answer", func() bool {
		if b, _ := os.ReadFile(filepath.Join(c.dir, port+".log")); bytes.Contains(b, []byte("Address already in use")) {
			bound = false
			return true
		}
		n := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		defer n.Close()
		return n.Ping(context.Background()).Err() == nil
	})
	if !bound {
		c.kill(i)
	}
	return bound
}

func (c *redisCluster) addrs() []string {
	a := make([]string, len(c.ports))
	for i, p := range c.ports {
		a[i] = "127.0.0.1:" + p
	}
	return a
}

// freePort returns a loopback port that is free, as is the port 10000
// above it (the cluster bus). Both are below Linux's ephemeral range
// (32768 up), so that outgoing connections, which take their ports from
// it, do not take them between this check and the node's start.
func freePort(tb testing.TB) string {
	for range 1000 {
		p := 12000 + rand.IntN(10000) // bus at 22000..31999
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		ln.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return strconv.Itoa(p)
	}
	tb.Fatal("no free pair of loopback ports for a cluster node")
	return ""
}

// startCluster starts the six nodes and joins them with redis-cli
// --cluster create, then waits until every node reports the cluster ok and
// every replica is in sync. The caller stops it.
func startCluster(tb testing.TB) *redisCluster {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	cli, err2 := exec.LookPath("redis-cli")
	if err != nil || err2 != nil {
		if os.Getenv(envClusterRequired) != "" {
			tb.Fatalf("redis-server or redis-cli is not on PATH, and %s is set", envClusterRequired)
		}
		tb.Skip("redis-server or redis-cli is not on PATH: the Redis Cluster tests start a cluster of their own")
	}
	dir, err := os.MkdirTemp("", "guardrail-redis-cluster-")
	if err != nil {
		tb.Fatal(err)
	}
	c := &redisCluster{bin: bin, dir: dir}
	for range 6 {
		c.ports = append(c.ports, freePort(tb))
	}
	c.procs = make([]*exec.Cmd, len(c.ports))
	for i := range c.ports {
		for try := 0; !c.tryNode(tb, i); try++ {
			if try == 10 {
				c.stop()
				tb.Fatalf("node %d: ten ports in a row were taken before it could listen", i)
			}
			c.ports[i] = freePort(tb)
		}
	}
	args := append([]string{"--cluster", "create"}, c.addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		c.stop()
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitHealthy(tb)
	return c
}

// waitHealthy waits until every live node says cluster_state:ok and every
// replica's link to its master is up.
func (c *redisCluster) waitHealthy(tb testing.TB) {
	tb.Helper()
	for i, a := range c.addrs() {
		if c.procs[i].ProcessState != nil {
			continue // stopped on purpose
		}
		waitFor(tb, "node "+a+" to be part of a healthy cluster", func() bool {
			n := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
			defer n.Close()
			ctx := context.Background()
			info, err := n.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
			repl, err := n.Info(ctx, "replication").Result()
			return err == nil && (strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up"))
		})
	}
}

// waitFor polls cond until it holds, for at most 60 s: the cluster is
// other processes, with no event to wait on.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for d := 10 * time.Millisecond; !cond(); d = min(2*d, 250*time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(d)
	}
}

func (c *redisCluster) kill(i int) {
	if c.procs[i] != nil && c.procs[i].ProcessState == nil {
		_ = c.procs[i].Process.Kill()
		_ = c.procs[i].Wait()
	}
}

func (c *redisCluster) stop() {
	for i := range c.procs {
		c.kill(i)
	}
}

func (c *redisCluster) client(tb testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.addrs(), DialTimeout: time.Second, MaxRedirects: 8, DialerRetries: 1})
	tb.Cleanup(func() { cc.Close() })
	return cc
}

var shared struct {
	once sync.Once
	c    *redisCluster
	err  string
	skip string
}

// sharedCluster is one cluster for the conformance tests of this package,
// started by the first test that needs it and stopped by TestMain.
func sharedCluster(tb testing.TB) *redisCluster {
	tb.Helper()
	shared.once.Do(func() {
		r := &recordingTB{TB: tb}
		func() {
			defer func() { _ = recover() }()
			shared.c = startCluster(r)
		}()
		shared.err, shared.skip = r.fatal, r.skip
	})
	if shared.skip != "" {
		tb.Skip(shared.skip)
	}
	if shared.c == nil {
		tb.Fatalf("starting the Redis Cluster: %s", shared.err)
	}
	return shared.c
}

// recordingTB turns the first test's Skip and Fatal while it starts the
// shared cluster into a record every test that needs the cluster repeats.
type recordingTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Fatal(args ...any) {
	r.fatal = fmt.Sprint(args...)
	panic(r)
}
func (r *recordingTB) Fatalf(f string, args ...any) {
	r.fatal = fmt.Sprintf(f, args...)
	panic(r)
}
func (r *recordingTB) Skip(args ...any) {
	r.skip = fmt.Sprint(args...)
	panic(r)
}

func stopSharedCluster(int) {
	if shared.c != nil {
		shared.c.stop()
	}
}

// clusterHarness runs the store on a *redis.ClusterClient against the
// shared cluster; replicas is Config.Replicas.
func clusterHarness(replicas int) storetest.Harness {
	return storetest.Harness{New: func(t *testing.T) storetest.Subject {
		cl := sharedCluster(t)
		client := cl.client(t)
		prefix := "guardrail-test:" + idempotency.NewToken()[:12] + ":"
		keys := func() []string {
			var mu sync.Mutex
			var all []string
			err := client.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
				k, err := m.Keys(ctx, prefix+"*").Result()
				mu.Lock()
				all = append(all, k...)
				mu.Unlock()
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			return all
		}
		t.Cleanup(func() {
			for _, k := range keys() {
				client.Del(context.Background(), k)
			}
		})
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
	cl := sharedCluster(t)
	client := cl.client(t)
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
	cl := startCluster(t)
	defer cl.stop()
	client := cl.client(t)
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
	for i, a := range cl.addrs() {
		n := redis.NewClient(&redis.Options{Addr: a})
		repl := n.Info(ctx, "replication").Val()
		n.Close()
		if victim < 0 && strings.Contains(repl, "role:master") {
			victim = i
		}
	}
	for i, a := range cl.addrs() {
		n := redis.NewClient(&redis.Options{Addr: a})
		repl := n.Info(ctx, "replication").Val()
		n.Close()
		if strings.Contains(repl, "master_port:"+cl.ports[victim]+"\r\n") {
			heir = i
		}
	}
	if heir < 0 {
		t.Fatalf("no replica of the master on port %s", cl.ports[victim])
	}
	cl.kill(victim)
	n := redis.NewClient(&redis.Options{Addr: cl.addrs()[heir]})
	defer n.Close()
	if err := n.Do(ctx, "CLUSTER", "FAILOVER", "FORCE").Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER FORCE: %v", err)
	}
	waitFor(t, "the replica to be promoted", func() bool {
		return strings.Contains(n.Info(ctx, "replication").Val(), "role:master")
	})
	// The promoted master has no replica: with Replicas 1 its writes fail
	// (503, retried by the clients) until the old master, restarted,
	// rejoins as its replica.
	cl.startNode(t, victim)
	cl.waitHealthy(t)
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
