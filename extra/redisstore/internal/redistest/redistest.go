// Package redistest starts the Redis servers the tests of this module run
// against: the standalone server CI names, and Redis Clusters of their own.
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
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
)

// EnvClusterRequired, when set, turns the cluster tests' skip (no
// redis-server on PATH) into a failure, so CI cannot pass without them.
const EnvClusterRequired = "GUARDRAIL_TEST_REDIS_CLUSTER_REQUIRED"

// Cluster is a Redis Cluster of the test's own: three masters and
// three replicas on loopback ports, each node a redis-server process.
type Cluster struct {
	bin, dir string
	ports    []string
	procs    []*exec.Cmd
}

// StartNode starts node i, or restarts it: it keeps its nodes file, so a
// restarted node rejoins the cluster with its identity.
func (c *Cluster) StartNode(tb testing.TB, i int) {
	tb.Helper()
	if !c.tryNode(tb, i) {
		tb.Fatalf("node 127.0.0.1:%s could not listen: its port was taken", c.ports[i])
	}
}

// tryNode starts node i and waits until it answers; it reports false,
// at once, when the node could not bind its port, which another process
// may take between freePort's check and the node's start.
func (c *Cluster) tryNode(tb testing.TB, i int) bool {
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
	WaitFor(tb, "node "+a+" to answer", func() bool {
		if b, _ := os.ReadFile(filepath.Join(c.dir, port+".log")); bytes.Contains(b, []byte("Address already in use")) {
			bound = false
			return true
		}
		n := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		defer n.Close()
		return n.Ping(context.Background()).Err() == nil
	})
	if !bound {
		c.Kill(i)
	}
	return bound
}

// Addrs returns the nodes' addresses, host:port, in the order of their
// indexes.
func (c *Cluster) Addrs() []string {
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

// StartCluster starts the six nodes and joins them with redis-cli
// --cluster create, then waits until every node reports the cluster ok and
// every replica is in sync. The caller stops it.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	cli, err2 := exec.LookPath("redis-cli")
	if err != nil || err2 != nil {
		if os.Getenv(EnvClusterRequired) != "" {
			tb.Fatalf("redis-server or redis-cli is not on PATH, and %s is set", EnvClusterRequired)
		}
		tb.Skip("redis-server or redis-cli is not on PATH: the Redis Cluster tests start a cluster of their own")
	}
	dir, err := os.MkdirTemp("", "guardrail-redis-cluster-")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cluster{bin: bin, dir: dir}
	for range 6 {
		c.ports = append(c.ports, freePort(tb))
	}
	c.procs = make([]*exec.Cmd, len(c.ports))
	for i := range c.ports {
		for try := 0; !c.tryNode(tb, i); try++ {
			if try == 10 {
				c.Stop()
				tb.Fatalf("node %d: ten ports in a row were taken before it could listen", i)
			}
			c.ports[i] = freePort(tb)
		}
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		c.Stop()
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy(tb)
	return c
}

// WaitHealthy waits until every live node says cluster_state:ok and every
// replica's link to its master is up.
func (c *Cluster) WaitHealthy(tb testing.TB) {
	tb.Helper()
	for i, a := range c.Addrs() {
		if c.procs[i].ProcessState != nil {
			continue // stopped on purpose
		}
		WaitFor(tb, "node "+a+" to be part of a healthy cluster", func() bool {
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

// WaitFor polls cond until it holds, for at most 60 s: the cluster is
// other processes, with no event to wait on.
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for d := 10 * time.Millisecond; !cond(); d = min(2*d, 250*time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(d)
	}
}

// Kill kills node i with SIGKILL, as a crash would, and waits for it to
// exit; a node already stopped is left alone.
func (c *Cluster) Kill(i int) {
	if c.procs[i] != nil && c.procs[i].ProcessState == nil {
		_ = c.procs[i].Process.Kill()
		_ = c.procs[i].Wait()
	}
}

// Stop kills every node that still runs.
func (c *Cluster) Stop() {
	for i := range c.procs {
		c.Kill(i)
	}
}

// Client returns a client of the cluster, closed when the test ends. A
// command's context deadline bounds its network calls too, so that a
// killed node costs a test the deadline it set, not go-redis's timeouts.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), DialTimeout: time.Second, MaxRedirects: 8, DialerRetries: 1,
		ContextTimeoutEnabled: true})
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// MasterOf returns the index of the node that is the master of key's
// slot, for Kill.
func (c *Cluster) MasterOf(tb testing.TB, cc *redis.ClusterClient, key string) int {
	tb.Helper()
	master, err := cc.MasterForKey(context.Background(), key)
	if err != nil {
		tb.Fatal(err)
	}
	addr := master.Options().Addr
	for i, a := range c.Addrs() {
		if a == addr {
			return i
		}
	}
	tb.Fatalf("the master %s of %q is not a node of the cluster", addr, key)
	return -1
}

var shared struct {
	once sync.Once
	c    *Cluster
	err  string
	skip string
}

// Shared is one cluster for the conformance tests of this package,
// started by the first test that needs it and stopped by TestMain.
func Shared(tb testing.TB) *Cluster {
	tb.Helper()
	shared.once.Do(func() {
		r := &recordingTB{TB: tb}
		func() {
			defer func() { _ = recover() }()
			shared.c = StartCluster(r)
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

// StopShared stops the shared cluster, if a test started it; TestMain
// calls it with the tests' exit code.
func StopShared(int) {
	if shared.c != nil {
		shared.c.Stop()
	}
}

// Port is node i's port.
func (c *Cluster) Port(i int) string { return c.ports[i] }

// EnvAddr names the environment variable that holds the address of the
// standalone Redis server the tests use.
const EnvAddr = "GUARDRAIL_TEST_REDIS_ADDR"

// Addr returns the standalone server's address, or skips the test, saying
// how to run it, when EnvAddr is unset.
func Addr(tb testing.TB) string {
	tb.Helper()
	addr := os.Getenv(EnvAddr)
	if addr == "" {
		tb.Skip(EnvAddr + " is not set: set it to a Redis server (for example 127.0.0.1:6379) to run the Redis tests")
	}
	return addr
}

// NewClient connects to addr with opts, fails the test when the server does
// not answer, and closes the client when the test ends.
func NewClient(tb testing.TB, addr string, opts redis.Options) *redis.Client {
	tb.Helper()
	opts.Addr = addr
	c := redis.NewClient(&opts)
	tb.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("Redis at %s (%s) is not reachable: %v", addr, EnvAddr, err)
	}
	return c
}

// Prefix is a key prefix unique to the test, so packages and tests running
// at the same time never share keys; the test's keys are deleted when it
// ends.
func Prefix(tb testing.TB, direct *redis.Client) string {
	var b [6]byte
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	prefix := fmt.Sprintf("guardrail-test:%x:", b)
	tb.Cleanup(func() {
		ctx := context.Background()
		iter := direct.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			direct.Del(ctx, iter.Val())
		}
	})
	return prefix
}

// ClusterPrefix is Prefix on a Redis Cluster: a key prefix unique to the
// test, whose keys are deleted on every master when it ends. keys lists
// them, from every master.
func ClusterPrefix(tb testing.TB, cc *redis.ClusterClient) (prefix string, keys func() []string) {
	var b [6]byte
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	prefix = fmt.Sprintf("guardrail-test:%x:", b)
	keys = func() []string {
		var mu sync.Mutex
		var all []string
		err := cc.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
			k, err := m.Keys(ctx, prefix+"*").Result()
			mu.Lock()
			all = append(all, k...)
			mu.Unlock()
			return err
		})
		if err != nil {
			tb.Fatal(err)
		}
		return all
	}
	tb.Cleanup(func() {
		for _, k := range keys() {
			cc.Del(context.Background(), k)
		}
	})
	return prefix, keys
}

// Server is a standalone redis-server of the test's own, without
// persistence, on a loopback port the test chose, so that it can be
// killed and started again on the same port: a Redis that crashes and
// comes back empty.
type Server struct {
	bin, dir, port string
	cmd            *exec.Cmd
}

// StartServer starts a Server and waits until it answers. It skips the
// test when redis-server is not on PATH, or fails it when
// EnvClusterRequired is set. The server is stopped when the test ends.
func StartServer(tb testing.TB) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv(EnvClusterRequired) != "" {
			tb.Fatalf("redis-server is not on PATH, and %s is set", EnvClusterRequired)
		}
		tb.Skip("redis-server is not on PATH: the restart tests start a Redis server of their own")
	}
	s := &Server{bin: bin, dir: tb.TempDir()}
	for try := 0; ; try++ {
		s.port = freePort(tb)
		if s.try(tb) {
			break
		}
		if try == 10 {
			tb.Fatal("ten ports in a row were taken before redis-server could listen")
		}
	}
	tb.Cleanup(s.Kill)
	return s
}

// Addr is the server's address, host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + s.port }

// Start starts the server again on its port, after Kill, and waits until
// it answers.
func (s *Server) Start(tb testing.TB) {
	tb.Helper()
	if !s.try(tb) {
		tb.Fatalf("redis-server could not listen on %s again: the port was taken", s.Addr())
	}
}

// try starts the server and waits until it answers; it reports false, at
// once, when the server could not bind its port.
func (s *Server) try(tb testing.TB) bool {
	tb.Helper()
	logName := filepath.Join(s.dir, "redis-"+s.port+".log")
	log, err := os.OpenFile(logName, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer log.Close()
	s.cmd = exec.Command(s.bin, "--port", s.port, "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	// Polled every 5 ms, not with WaitFor's backoff: a test measures how
	// soon after this returns its clients see the server again.
	// A plain connection: go-redis's own dial retries would wait 100 ms
	// between tries.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(logName); bytes.Contains(b, []byte("Address already in use")) {
			s.Kill()
			return false
		}
		if ping(s.Addr()) {
			return true
		}
		if time.Now().After(deadline) {
			s.Kill()
			tb.Fatalf("timed out waiting for redis-server on %s to answer", s.Addr())
		}
	}
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it
// to exit; a server already stopped is left alone.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// ping reports whether the Redis at addr answers PING within a second.
func ping(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}
