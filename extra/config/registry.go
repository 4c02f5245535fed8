package config

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/fleet"
	"github.com/guardrail-go/guardrail/shed"
)

// ErrUnknown is the sentinel of a lookup by a name the file does not hold.
var ErrUnknown = errors.New("config: no such name in the policy file")

// Options are what a Registry needs besides the file. The zero value is
// valid. A plain value; what it points to must be safe for concurrent use.
type Options struct {
	// Observer receives the events of every value the Registry builds:
	// calls, retries, breaker transitions, shedding; and one
	// event.ConfigReload per reload attempt (Reload, ReloadBytes, a
	// SIGHUP, Watch), OutcomeOK or OutcomeError, which the metrics
	// adapters count as guardrail_config_reloads_total{outcome}. Nil
	// costs nothing.
	Observer event.Observer
	// Logger receives one line per reload, applied or rejected, and per
	// admin action. Nil means slog.Default().
	Logger *slog.Logger
	// OnReload, if set, is called after every reload attempt with its
	// outcome, for a metric or an alert; it runs on the reloading
	// goroutine.
	OnReload func(ReloadResult)
	// TokenStore is the store of every rate_limit section with shared:
	// their limits hold across every process that shares it (a
	// redisfleet.Store on the fleet's Redis). A file with such a section
	// and no TokenStore is refused by Registry.RateLimiter.
	TokenStore fleet.TokenStore
}

// ReloadResult is the outcome of one reload. A plain value.
type ReloadResult struct {
	// File is the file read.
	File string
	// Err is nil when the new settings were applied; otherwise they were
	// rejected and the old ones stay. An invalid file's error is an *Error.
	Err error
	// Changed names the dependencies and servers whose settings changed.
	Changed []string
	// Warnings of the new file.
	Warnings []Diagnostic
}

// ReloadStats counts reloads, for the admin endpoint and metrics. A plain
// value.
type ReloadStats struct {
	Applied   uint64    `json:"applied"`
	Rejected  uint64    `json:"rejected"`
	LastError string    `json:"last_error,omitempty"`
	LastAt    time.Time `json:"last_at,omitzero"`
}

// Registry holds the guardrail values a policy file configures, by name.
// Each value it hands out is a handle whose settings a reload swaps
// atomically: calls started before the swap finish under the old
// settings, calls started after it run under the new. Breakers, budgets,
// bulkheads, throttlers and shedders whose settings did not change are
// kept across a reload, state included. One dependency has one throttler,
// shared by every client and policy handle of it.
//
// A Registry is safe for concurrent use.
type Registry struct {
	path string
	opts Options
	log  *slog.Logger

	mu      sync.Mutex // serialises reloads and handle creation
	checked atomic.Pointer[checkedFile]
	pool    map[poolKey]pooled // the values kept across reloads
	lastMod time.Time
	lastLen int64

	https    map[string]*httpHandle
	grpcs    map[string]*GRPCHandle
	policies map[string]*PolicyHandle
	dls      map[string]*deadlineEntry
	sheds    map[string]*Handle[shed.Shedder]
	idems    map[string][]*idempotencyEntry
	limits   map[string][]*rateLimitEntry

	statsMu sync.Mutex // serialises updates of stats
	stats   atomic.Pointer[ReloadStats]
}

// Load reads the policy file at path and builds its values. It returns an
// *Error that Is ErrInvalidConfig, listing every error of the file with its
// line, when the file does not check; a file over 1 MiB does not (a
// policy file is a page or two, and the bound keeps a wrong path, a log or
// a binary, from being read whole).
func Load(path string, opts Options) (*Registry, error) {
	data, mod, size, err := readFile(path)
	if err != nil {
		return nil, err
	}
	r, err := New(path, data, opts)
	if err != nil {
		return nil, err
	}
	r.lastMod, r.lastLen = mod, size
	return r, nil
}

// New builds a Registry from the contents of a policy file; name names it
// in diagnostics and is the path Reload reads again.
func New(name string, data []byte, opts Options) (*Registry, error) {
	c, err := parse(name, data)
	if err != nil {
		return nil, err
	}
	r := &Registry{path: name, opts: opts, log: opts.Logger, pool: map[poolKey]pooled{},
		https: map[string]*httpHandle{}, grpcs: map[string]*GRPCHandle{}, policies: map[string]*PolicyHandle{},
		dls: map[string]*deadlineEntry{}, sheds: map[string]*Handle[shed.Shedder]{},
		idems: map[string][]*idempotencyEntry{}, limits: map[string][]*rateLimitEntry{}}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.stats.Store(&ReloadStats{})
	if _, err := r.apply(c); err != nil {
		return nil, err
	}
	return r, nil
}

// readFile reads the policy file at path, at most maxFileSize+1 bytes (the
// parser refuses more), refusing what is not a regular file: a FIFO would
// hang Load and Reload, a device such as /dev/zero never ends.
func readFile(path string) ([]byte, time.Time, int64, error) {
	if st, err := os.Stat(path); err != nil {
		return nil, time.Time{}, 0, err
	} else if !st.Mode().IsRegular() {
		return nil, time.Time{}, 0, fmt.Errorf("config: %s: not a regular file (%v)", path, st.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, time.Time{}, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, time.Time{}, 0, err
	}
	if !st.Mode().IsRegular() {
		return nil, time.Time{}, 0, fmt.Errorf("config: %s: not a regular file once opened", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	return data, st.ModTime(), st.Size(), err
}

// Stats returns the reload counters.
func (r *Registry) Stats() ReloadStats { return *r.stats.Load() }

// Reload reads the file again and applies it to new calls. An invalid file
// is rejected: the old settings stay, the error is logged and returned,
// Options.Observer receives an event.ConfigReload with OutcomeError, and
// Options.OnReload hears of it.
func (r *Registry) Reload() error {
	data, mod, size, err := readFile(r.path)
	if err == nil {
		r.mu.Lock()
		r.lastMod, r.lastLen = mod, size
		r.mu.Unlock()
		err = r.ReloadBytes(data)
		return err
	}
	r.rejected(err, nil)
	return err
}

// ReloadBytes applies the contents of a policy file as Reload does.
func (r *Registry) ReloadBytes(data []byte) error {
	c, err := parse(r.path, data)
	if err != nil {
		r.rejected(err, c)
		return err
	}
	changed, err := r.apply(c)
	if err != nil {
		r.rejected(err, c)
		return err
	}
	r.count(nil)
	r.observe(nil)
	r.log.Info("config: reloaded", "file", r.path, "changed", changed, "warnings", len(c.Warnings))
	for _, w := range c.Warnings {
		r.log.Warn("config: "+w.String(), "file", r.path)
	}
	if r.opts.OnReload != nil {
		r.opts.OnReload(ReloadResult{File: r.path, Changed: changed, Warnings: c.Warnings})
	}
	return nil
}

func (r *Registry) count(err error) {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	st := *r.stats.Load()
	if err != nil {
		st.Rejected++
		st.LastError = err.Error()
	} else {
		st.Applied++
	}
	st.LastAt = time.Now()
	r.stats.Store(&st)
}

// observe reports one reload attempt to the Observer.
func (r *Registry) observe(err error) {
	if r.opts.Observer == nil {
		return
	}
	e := event.Event{Kind: event.ConfigReload, Outcome: event.OutcomeOK, Detail: r.path}
	if err != nil {
		e.Outcome, e.Err = event.OutcomeError, err
	}
	r.opts.Observer.Observe(context.Background(), e)
}

func (r *Registry) rejected(err error, c *checkedFile) {
	r.count(err)
	r.observe(err)
	r.log.Error("config: reload rejected; the settings in force stay", "file", r.path, "error", err)
	if r.opts.OnReload != nil {
		res := ReloadResult{File: r.path, Err: err}
		if c != nil {
			res.Warnings = c.Warnings
		}
		r.opts.OnReload(res)
	}
}

// WatchSignal reloads the file on every SIGHUP until ctx is done. It is
// opt-in: call it from main. It returns at once; the watching goroutine
// ends with ctx.
func (r *Registry) WatchSignal(ctx context.Context) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				_ = r.Reload() // logged and counted by Reload
			}
		}
	}()
}

// Watch polls the file's modification time and size every interval and
// reloads it when either changes, until ctx is done. It returns at once;
// the watching goroutine ends with ctx. A zero interval means 2 s.
func (r *Registry) Watch(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = 2 * time.Second
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				r.poll()
			}
		}
	}()
}

// poll reloads the file if it changed since it was last read.
func (r *Registry) poll() {
	st, err := os.Stat(r.path)
	if err != nil {
		return
	}
	r.mu.Lock()
	same := st.ModTime().Equal(r.lastMod) && st.Size() == r.lastLen
	r.mu.Unlock()
	if !same {
		_ = r.Reload()
	}
}
