//go:build unix

package pgstore_test

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/guardrail-go/guardrail/extra/pgstore"
	"github.com/guardrail-go/guardrail/idempotency"
)

// pgServer is a PostgreSQL server of the test's own, in a temporary
// directory, so that it can be restarted without touching the shared one.
type pgServer struct {
	bin  string              // directory of initdb and pg_ctl
	dir  string              // holds the data directory, the socket and the log
	port string              // on 127.0.0.1
	cred *syscall.Credential // the user it runs as; nil for our own
	up   bool
}

// pgBinDir finds the directory of the PostgreSQL server programs: where
// pg_config says, on PATH, or in the Debian layout (the newest version).
func pgBinDir() (string, bool) {
	has := func(dir string) bool {
		for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				return false
			}
		}
		return true
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); has(dir) {
			return dir, true
		}
	}
	if path, err := exec.LookPath("pg_ctl"); err == nil {
		// Often a link: the programs are where it points.
		if path, err = filepath.EvalSymlinks(path); err == nil && has(filepath.Dir(path)) {
			return filepath.Dir(path), true
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64) // "15", "9.6"
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int { return cmp.Compare(version(b), version(a)) })
	for _, dir := range dirs {
		if has(dir) {
			return dir, true
		}
	}
	return "", false
}

// newPGServer creates a database cluster in a new directory, without
// starting it. PostgreSQL refuses to run as root: when we are root it
// runs as the postgres user, which then owns the directory.
func newPGServer(t *testing.T) *pgServer {
	t.Helper()
	bin, ok := pgBinDir()
	if !ok {
		t.Skip("no PostgreSQL server programs (initdb, pg_ctl) found with pg_config, on PATH or in /usr/lib/postgresql: the restart test starts a PostgreSQL of its own")
	}
	s := &pgServer{bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skipf("running as root and there is no postgres user to run PostgreSQL as: %v", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Not t.TempDir: its parent is private to us, and the server may
	// run as another user.
	dir, err := os.MkdirTemp("", "pgstore-restart-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	s.dir = dir
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()

	if err := s.run("initdb", "-D", s.data(), "-U", "postgres", "-A", "trust", "--no-locale", "-E", "UTF8", "--no-sync"); err != nil {
		t.Fatal(err)
	}
	// In the configuration, not on pg_ctl's command line, which goes
	// through a shell: every start uses the same settings. fsync is off
	// for speed; a clean shutdown still writes everything out.
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %s
unix_socket_directories = '%s'
fsync = off
max_connections = 20
shared_buffers = 16MB
`, s.port, strings.ReplaceAll(s.dir, "'", "''"))
	f, err := os.OpenFile(filepath.Join(s.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.WriteString(f, conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *pgServer) data() string { return filepath.Join(s.dir, "data") }

// run runs one of the server programs as the server's user.
func (s *pgServer) run(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"LC_ALL=C", "PATH=" + os.Getenv("PATH")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// start starts the server and returns once it accepts connections:
// pg_ctl -w waits for that, within -t seconds.
func (s *pgServer) start(t *testing.T) {
	t.Helper()
	// The server's output goes to a file: on a pipe, it would keep
	// pg_ctl's output open for as long as the server runs.
	log := filepath.Join(s.dir, "log")
	s.up = true // even if pg_ctl gives up waiting, the server may run
	if err := s.run("pg_ctl", "start", "-D", s.data(), "-l", log, "-w", "-t", "30"); err != nil {
		b, _ := os.ReadFile(log)
		t.Fatalf("%v\nserver log:\n%s", err, b)
	}
}

// stop shuts the server down as a service manager does (fast: open
// sessions are ended, then a checkpoint) and waits until it has exited.
func (s *pgServer) stop() error {
	if err := s.run("pg_ctl", "stop", "-D", s.data(), "-m", "fast", "-w", "-t", "30"); err != nil {
		return err
	}
	s.up = false
	return nil
}

// reconnect waits until pool reaches the restarted server. Each pooled
// connection to the old server fails once and is dropped, and the pool
// dials a new one only when none is left, so that takes at most one try
// per connection, plus one.
func reconnect(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var err error
	for range pool.Config().MaxConns + 1 {
		if err = pool.Ping(t.Context()); err == nil {
			return
		}
	}
	t.Fatalf("the pool did not reconnect after the restart: %v", err)
}

// syncBuffer is a bytes.Buffer safe for concurrent use, for logs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A response stored before PostgreSQL restarts is replayed after, byte for
// byte, without running the handler: stored responses are committed rows,
// and the pool reconnects. So are locks: a request in flight across the
// restart completes its key with the token it took before, and its retry
// is replayed. While the server is down the middleware fails closed: a new
// request gets 503 and its handler does not run. A handler that finishes
// then still answers its client, but its response cannot be stored; its
// key stays locked after the restart (409) until its lease ends, and then
// a retry runs the handler again, as documented.
func TestStoreRestartKeepsData(t *testing.T) {
	dsn(t) // integration tests only
	srv := newPGServer(t)
	t.Cleanup(func() {
		if srv.up {
			if err := srv.stop(); err != nil {
				t.Error(err)
			}
		}
	})
	srv.start(t)

	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:" + srv.port + "/postgres?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store := must(pgstore.New(pool, pgstore.Config{}))
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}

	// Requests with these keys wait in the handler, before charging,
	// until their gate is closed.
	gates := map[string]chan struct{}{
		"pay-down": make(chan struct{}), // finishes while the server is down
		"pay-up":   make(chan struct{}), // finishes after the restart
	}
	started := make(chan string, len(gates))
	var charges atomic.Int64
	var logs syncBuffer
	h := middleware(store, idempotency.Config{
		Lease:  time.Minute, // far longer than the test: only the test ends it
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gate, ok := gates[r.Header.Get(idempotency.HeaderKey)]; ok {
			started <- r.Header.Get(idempotency.HeaderKey)
			select {
			case <-gate:
			case <-r.Context().Done(): // the test ended early
				return
			}
		}
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, n)
	}))
	post := func(key string) *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
		r.Header.Set(idempotency.HeaderKey, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	// inFlight posts key and returns once its handler runs.
	inFlight := func(key string) <-chan *httptest.ResponseRecorder {
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() { done <- post(key) }()
		if got := <-started; got != key {
			t.Fatalf("handler started for %q, want %q", got, key)
		}
		return done
	}
	check := func(step string, w *httptest.ResponseRecorder, code int, body string, replayed bool) {
		t.Helper()
		if w.Code != code || w.Body.String() != body || (w.Header().Get(idempotency.HeaderReplayed) == "true") != replayed {
			t.Errorf("%s: %d %q replayed=%q, want %d %q replayed=%v",
				step, w.Code, w.Body.String(), w.Header().Get(idempotency.HeaderReplayed), code, body, replayed)
		}
	}

	check("first POST", post("pay-stored"), http.StatusCreated, `{"charge":1}`, false)
	down := inFlight("pay-down")
	up := inFlight("pay-up")

	if err := srv.stop(); err != nil {
		t.Fatal(err)
	}
	w := post("pay-refused")
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Errorf("new key, server down: %d Retry-After %q, want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	close(gates["pay-down"])
	check("handler finished while the server was down", <-down, http.StatusCreated, `{"charge":2}`, false)
	if !strings.Contains(logs.String(), "storing the response failed") {
		t.Errorf("the failure to store the response was not logged; logs:\n%s", logs.String())
	}
	if n := charges.Load(); n != 2 {
		t.Fatalf("charged %d times with the server down, want 2 (the refused request not run)", n)
	}

	srv.start(t)
	// A pooled connection from before the restart fails its next call
	// (the pool pings only those idle for over a second): drop them first,
	// so that pay-up's response meets the new server.
	reconnect(t, pool)

	close(gates["pay-up"])
	check("handler finished after the restart", <-up, http.StatusCreated, `{"charge":3}`, false)

	w = post("pay-stored")
	check("stored before the restart", w, http.StatusCreated, `{"charge":1}`, true)
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("stored before the restart: Content-Type %q, want the stored application/json", ct)
	}
	check("in flight across the restart", post("pay-up"), http.StatusCreated, `{"charge":3}`, true)
	check("refused while down, retried", post("pay-refused"), http.StatusCreated, `{"charge":4}`, false)

	// pay-down's handler charged, but its response was never stored: its
	// lock, taken before the restart, still holds the key until its lease
	// ends.
	w = post("pay-down")
	if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Errorf("key whose response was not stored: %d Retry-After %q, want 409 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	// End the lease on the database's clock: pay-down's is the only lock
	// left. Then a retry runs the handler again, as documented.
	tag, err := pool.Exec(t.Context(), "UPDATE "+pgstore.DefaultTable+" SET expires_at = now() WHERE token IS NOT NULL")
	if err != nil {
		t.Fatal(err)
	}
	if n := tag.RowsAffected(); n != 1 {
		t.Fatalf("%d locks left after the restart, want pay-down's", n)
	}
	check("after the lease ended", post("pay-down"), http.StatusCreated, `{"charge":5}`, false)

	if n := charges.Load(); n != 5 {
		t.Fatalf("charged %d times, want 5: once per key, and pay-down twice (its response was not stored)", n)
	}
}
