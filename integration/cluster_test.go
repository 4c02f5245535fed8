package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/extra/redisstore"
	"github.com/guardrail-go/guardrail/idempotency"
)

// envClusterRequired, when set, turns the Redis Cluster tests' skip (no
// redis-server or redis-cli on PATH) into a failure, so CI cannot pass
// without them. The cluster is the tests' own, as in extra/redisstore:
// three masters and three replicas on free loopback ports.
const envClusterRequired = "GUARDRAIL_TEST_REDIS_CLUSTER_REQUIRED"

// cluster is the Redis Cluster the tests of this package share: started
// by the first that needs it, stopped by TestMain.
var cluster struct {
	once  sync.Once
	addrs []string
	procs []*exec.Cmd
	dir   string
	skip  string
	err   error
}

// newCluster returns a store on a client of the shared cluster, its keys
// under a prefix of the test's own, deleted when the test ends.
func newCluster(tb testing.TB) idempotency.Store {
	tb.Helper()
	return newClusterStore(tb, 0)
}

// newClusterStore is newCluster with Config.Replicas.
func newClusterStore(tb testing.TB, replicas int) *redisstore.Store {
	tb.Helper()
	cluster.once.Do(startCluster)
	if cluster.skip != "" {
		tb.Skip(cluster.skip)
	}
	if cluster.err != nil {
		tb.Fatalf("starting the Redis Cluster: %v", cluster.err)
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.addrs, DialTimeout: time.Second, MaxRedirects: 8, DialerRetries: 1})
	prefix := "guardrail-integration:" + idempotency.NewToken()[:12] + ":"
	tb.Cleanup(func() {
		ctx := context.Background()
		_ = client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			keys, err := m.Keys(ctx, prefix+"*").Result()
			for _, k := range keys {
				m.Del(ctx, k)
			}
			return err
		})
		client.Close()
	})
	s, err := redisstore.New(client, redisstore.Config{Prefix: prefix, Replicas: replicas})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// startCluster starts six nodes and joins them with redis-cli --cluster
// create, then waits until every node says the cluster is ok and every
// replica is in sync. It records a skip or an error for newCluster.
func startCluster() {
	bin, err := exec.LookPath("redis-server")
	cli, err2 := exec.LookPath("redis-cli")
	if err != nil || err2 != nil {
		if os.Getenv(envClusterRequired) != "" {
			cluster.err = fmt.Errorf("redis-server or redis-cli is not on PATH, and %s is set", envClusterRequired)
			return
		}
		cluster.skip = "redis-server or redis-cli is not on PATH: the Redis Cluster tests start a cluster of their own (set " + envClusterRequired + " to fail instead)"
		return
	}
	if cluster.dir, err = os.MkdirTemp("", "guardrail-integration-cluster-"); err != nil {
		cluster.err = err
		return
	}
	for range 6 {
		port, err := freePort()
		if err != nil {
			cluster.err = err
			return
		}
		log, err := os.OpenFile(filepath.Join(cluster.dir, port+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			cluster.err = err
			return
		}
		cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--dir", cluster.dir,
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+port+".conf",
			"--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no")
		cmd.Stdout, cmd.Stderr = log, log // a file, not a pipe: no goroutine copies it
		err = cmd.Start()
		log.Close()
		if err != nil {
			cluster.err = err
			return
		}
		cluster.procs = append(cluster.procs, cmd)
		cluster.addrs = append(cluster.addrs, "127.0.0.1:"+port)
	}
	for _, a := range cluster.addrs {
		if cluster.err = waitFor("node "+a+" to answer", func() bool { return nodeOK(a, false) }); cluster.err != nil {
			return
		}
	}
	args := append([]string{"--cluster", "create"}, cluster.addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		cluster.err = fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
		return
	}
	for _, a := range cluster.addrs {
		if cluster.err = waitFor("node "+a+" to be part of a healthy cluster", func() bool { return nodeOK(a, true) }); cluster.err != nil {
			return
		}
	}
}

// nodeOK reports whether the node at a answers and, with joined, says the
// cluster is ok and is a master or a replica in sync with its master.
func nodeOK(a string, joined bool) bool {
	n := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
	defer n.Close()
	ctx := context.Background()
	if !joined {
		return n.Ping(ctx).Err() == nil
	}
	info, err := n.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") {
		return false
	}
	repl, err := n.Info(ctx, "replication").Result()
	return err == nil && (strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up"))
}

// stopCluster stops the shared cluster's nodes, if they were started.
func stopCluster(int) {
	for _, p := range cluster.procs {
		_ = p.Process.Kill()
		_ = p.Wait()
	}
	if cluster.dir != "" {
		os.RemoveAll(cluster.dir)
	}
}

// waitFor polls cond until it holds, for at most 60 s: the cluster is
// other processes, with no event to wait on.
func waitFor(what string, cond func() bool) error {
	deadline := time.Now().Add(60 * time.Second)
	for d := 10 * time.Millisecond; !cond(); d = min(2*d, 250*time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("timed out waiting for " + what)
		}
		time.Sleep(d)
	}
	return nil
}

// freePort returns a loopback port that is free, as is the port 10000
// above it (the cluster bus).
func freePort() (string, error) {
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		p := ln.Addr().(*net.TCPAddr).Port
		if p+10000 > 65535 {
			ln.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		ln.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return strconv.Itoa(p), nil
	}
	return "", errors.New("no free pair of loopback ports for a cluster node")
}
