package redisstore_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/extra/redisstore"
	"github.com/guardrail-go/guardrail/extra/redisstore/internal/redistest"
	"github.com/guardrail-go/guardrail/idempotency"
)

// redisProcess is a redis-server of the test's own, persisting to an
// append-only file, so that it can be restarted without touching the
// shared server.
type redisProcess struct {
	bin, dir, port string
	cmd            *exec.Cmd
}

func (p *redisProcess) start(t *testing.T) {
	t.Helper()
	p.cmd = exec.Command(p.bin, "--port", p.port, "--bind", "127.0.0.1", "--dir", p.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--loglevel", "notice")
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Ready when it says so: no polling, no sleeping.
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "Ready to accept connections") {
			go func() { _, _ = io.Copy(io.Discard, out) }() // keep the pipe drained until it exits
			return
		}
	}
	t.Fatalf("redis-server exited before it was ready: %v", sc.Err())
}

func (p *redisProcess) stop(t *testing.T) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + p.port})
	_ = c.Shutdown(context.Background()).Err() // a clean shutdown, the AOF flushed
	c.Close()
	_ = p.cmd.Wait()
}

// A response stored before Redis restarts is replayed after: the store keeps
// nothing in the process, and a Redis that persists its data loses none.
func TestStoreRestartKeepsData(t *testing.T) {
	redistest.Addr(t) // integration tests only
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not on PATH: the restart test starts a Redis of its own")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	p := &redisProcess{bin: bin, dir: t.TempDir(), port: port}
	p.start(t)
	defer func() {
		if p.cmd.ProcessState == nil {
			p.stop(t)
		}
	}()

	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + port, MaxRetries: 3, DialTimeout: time.Second})
	defer client.Close()
	store := mustNew(client, redisstore.Config{Prefix: "restart:"})
	var charges atomic.Int64
	h := middleware(store, idempotency.Config{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "charge "+strconv.FormatInt(n, 10))
	}))
	post := func() (int, string, string) {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
		r.Header.Set(idempotency.HeaderKey, "pay-restart-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String(), w.Header().Get(idempotency.HeaderReplayed)
	}
	code, body, _ := post()
	if code != http.StatusCreated || body != "charge 1" {
		t.Fatalf("first POST: %d %q", code, body)
	}

	p.stop(t)
	p.start(t)

	code, body, replayed := post()
	if code != http.StatusCreated || body != "charge 1" || replayed != "true" {
		t.Fatalf("after the restart: %d %q replayed=%q, want the stored answer replayed", code, body, replayed)
	}
	if n := charges.Load(); n != 1 {
		t.Fatalf("charged %d times across a Redis restart, want once", n)
	}
}
