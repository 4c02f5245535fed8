package deadline

import (
	"context"
	"database/sql"
	"net"
	"net/http"
	"time"

	"github.com/guardrail-go/guardrail"
)

func direct(ctx context.Context, c *http.Client) {
	req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://x", nil) // want `\[deadline\] context.Background\(\) drops the caller's deadline and cancellation for http.NewRequestWithContext \(the function has ctx\)`
	c.Do(req)
}

func derived(ctx context.Context, db *sql.DB) {
	tctx, cancel := context.WithTimeout(context.TODO(), time.Second) // want `context.TODO\(\) drops the caller's deadline and cancellation for DB.QueryContext`
	defer cancel()
	db.QueryContext(tctx, "select 1")
}

func viaVar(ctx context.Context, d *net.Dialer) {
	bg := context.Background() // want `for Dialer.DialContext`
	d.DialContext(bg, "tcp", "x:1")
}

func handler(w http.ResponseWriter, r *http.Request) {
	req, _ := http.NewRequest("GET", "http://x", nil)
	req = req.WithContext(context.Background()) // want `the handler has r.Context\(\)`
	http.DefaultClient.Do(req)
}

func guardrailDo(ctx context.Context, p *guardrail.Policy) {
	guardrail.Do(context.Background(), p, func(ctx context.Context) (int, error) { return 0, nil }) // want `for guardrail.Do`
}

func noCallerContext(db *sql.DB) {
	db.QueryContext(context.Background(), "select 1") // no caller's context: fine
}

func detached(ctx context.Context, db *sql.DB) {
	go func() {
		db.ExecContext(context.Background(), "insert") // outlives the caller on purpose: fine
	}()
	defer db.ExecContext(context.Background(), "unlock") // cleanup after the caller's context may be done: fine
}

func notOutbound(ctx context.Context) {
	start(context.Background()) // not a call we know to be outbound: fine
	bg := context.Background()
	bg = ctx // reassigned: we cannot be sure
	_ = bg
}

func start(ctx context.Context) {}

func suppressed(ctx context.Context, db *sql.DB) {
	//guardrail:ignore deadline the audit row must be written even when the caller gave up
	db.ExecContext(context.Background(), "insert")
}

func cleanupLater(ctx context.Context, db *sql.DB) func() {
	return func() {
		db.ExecContext(context.Background(), "drop table t") // runs after the caller returned: fine
	}
}

func storedHook(ctx context.Context, db *sql.DB) {
	hook := func() { db.ExecContext(context.Background(), "unlock") } // kept for later: fine
	_ = hook
	func() {
		db.ExecContext(context.Background(), "select 1") // want `drops the caller's deadline`
	}()
}

func nilGuard(ctx context.Context, c *http.Client) {
	if ctx == nil {
		ctx = context.Background() // a nil guard keeps no caller's deadline from anyone: fine
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://x", nil)
	c.Do(req)
}
