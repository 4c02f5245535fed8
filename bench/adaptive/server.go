package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/bench/internal/pool"
)

// workload is the server side of one run: the pool's size by phase and the
// time each query holds its slot.
type workload struct {
	Slots []int         // pool size in each phase
	Phase time.Duration // length of each phase
	Hold  time.Duration // time a query holds its slot
}

func (w workload) total() time.Duration { return time.Duration(len(w.Slots)) * w.Phase }

// phaseOf is the phase index of an offset from the run's start, clamped to
// the phases.
func (w workload) phaseOf(off time.Duration) int {
	i := int(off / w.Phase)
	return max(0, min(i, len(w.Slots)-1))
}

// serverCounts is what the server saw in one phase, by the time a request
// arrived.
type serverCounts struct {
	Arrived   int64 // requests that reached the handler
	Rejected  int64 // refused by the limiter (503)
	Abandoned int64 // admitted, left the pool's line because the client went away
	OK        int64 // queries run to their end and answered 200
	OKGone    int64 // of OK, those whose client had gone away by the end
}

type phaseCounters struct {
	arrived, rejected, abandoned, ok, okGone atomic.Int64
}

// limitSample is the limiter's limit and the pool's state at one instant.
type limitSample struct {
	T       time.Duration `json:"-"`    // since the run's start
	TMs     float64       `json:"t_ms"` // T in milliseconds
	Limit   int           `json:"limit"`
	InUse   int           `json:"in_use"`
	Waiting int           `json:"waiting"`
	Slots   int           `json:"slots"`
}

// server is the HTTP server of one run: limiter in front of the pool.
type server struct {
	w     workload
	lim   concLimiter
	pool  *pool.Pool
	start time.Time
	ph    []phaseCounters

	srv  *http.Server
	ln   net.Listener
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	samples []limitSample
}

// startServer listens on 127.0.0.1 and serves until close. The schedule
// (pool resizes, limit sampling every 50 ms) starts at start.
func startServer(w workload, lim concLimiter, start time.Time) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &server{
		w: w, lim: lim, pool: pool.NewPool(w.Slots[0]), start: start,
		ph: make([]phaseCounters, len(w.Slots)), ln: ln, stop: make(chan struct{}),
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			panic(err)
		}
	}()
	go func() { defer s.wg.Done(); s.schedule() }()
	go func() { defer s.wg.Done(); s.sample() }()
	return s, nil
}

func (s *server) url() string { return "http://" + s.ln.Addr().String() + "/" }

func (s *server) schedule() {
	for i := 1; i < len(s.w.Slots); i++ {
		t := time.NewTimer(time.Until(s.start.Add(time.Duration(i) * s.w.Phase)))
		select {
		case <-t.C:
			s.pool.Resize(s.w.Slots[i])
		case <-s.stop:
			t.Stop()
			return
		}
	}
}

const sampleEvery = 50 * time.Millisecond

func (s *server) sample() {
	end := s.start.Add(s.w.total())
	for k := 0; ; k++ {
		at := s.start.Add(time.Duration(k) * sampleEvery)
		if at.After(end) {
			return
		}
		t := time.NewTimer(time.Until(at))
		select {
		case <-t.C:
		case <-s.stop:
			t.Stop()
			return
		}
		inUse, waiting, size := s.pool.Stats()
		s.mu.Lock()
		el := time.Since(s.start)
		s.samples = append(s.samples, limitSample{
			T: el, TMs: float64(el) / 1e6, Limit: s.lim.limit(), InUse: inUse, Waiting: waiting, Slots: size,
		})
		s.mu.Unlock()
	}
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := &s.ph[s.w.phaseOf(time.Since(s.start))]
	c.arrived.Add(1)
	ctx := r.Context()
	a, ok := s.lim.acquire(ctx)
	if !ok {
		c.rejected.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if err := s.pool.Acquire(ctx); err != nil {
		a.done(false)
		c.abandoned.Add(1)
		return
	}
	time.Sleep(s.w.Hold)
	s.pool.Release()
	gone := ctx.Err() != nil
	a.done(!gone)
	c.ok.Add(1)
	if gone {
		c.okGone.Add(1)
	}
	w.WriteHeader(http.StatusOK)
}

// close stops the server, waiting for its handlers, and returns what it saw.
func (s *server) close() ([]serverCounts, []limitSample) {
	close(s.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
	s.wg.Wait()
	out := make([]serverCounts, len(s.ph))
	for i := range s.ph {
		c := &s.ph[i]
		out[i] = serverCounts{
			Arrived: c.arrived.Load(), Rejected: c.rejected.Load(), Abandoned: c.abandoned.Load(),
			OK: c.ok.Load(), OKGone: c.okGone.Load(),
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return out, s.samples
}
