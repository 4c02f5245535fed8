package shed_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"time"
)

// pool is a fake backend with a fixed number of slots, like a database
// connection pool. A request takes a slot (waiting in FIFO order when none
// is free, and, like a real pool, not giving up when its caller does),
// holds it for service, and frees it. Inside a synctest bubble both the wait
// and the service are fake time.
type pool struct {
	sem     chan struct{}
	service time.Duration
}

func newPool(slots int, service time.Duration) *pool {
	return &pool{sem: make(chan struct{}, slots), service: service}
}

func (p *pool) serve() {
	p.sem <- struct{}{}
	time.Sleep(p.service)
	<-p.sem
}

func (p *pool) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.serve()
		w.Write([]byte("ok"))
	})
}

// outcome is what one client saw.
type outcome struct {
	code       int           // 0 on timeout
	latency    time.Duration // until the response, or the timeout
	retryAfter string
	req        *http.Request
}

// openLoop sends n requests to h, one every interval whatever happens to the
// earlier ones (an open-loop load, as real users are), each with a client
// timeout, and returns what each client saw. The server goes on with a
// request its client abandoned (its context is cancelled, as net/http does
// when the connection closes). Call it inside a synctest bubble.
func openLoop(h http.Handler, n int, interval, timeout time.Duration, mkReq func(i int) *http.Request) []outcome {
	out := make([]outcome, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		wg.Go(func() {
			req := mkReq(i)
			ctx, cancel := context.WithCancel(req.Context())
			defer cancel()
			req = req.WithContext(ctx)
			t0 := time.Now()
			done := make(chan *httptest.ResponseRecorder, 1)
			wg.Go(func() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				done <- rec
			})
			timer := time.NewTimer(timeout)
			defer timer.Stop()
			select {
			case rec := <-done:
				out[i] = outcome{code: rec.Code, latency: time.Since(t0), retryAfter: rec.Header().Get("Retry-After"), req: req}
			case <-timer.C:
				out[i] = outcome{latency: timeout, req: req}
			}
		})
	}
	wg.Wait()
	return out
}

// summary is what the clients of one overload run saw.
type summary struct {
	ok, shed, timeout int
	p50, p99          time.Duration // of the 200s
	shedMax           time.Duration // slowest 503
	badRetryAfter     int           // 503s without Retry-After: 1
}

func summarize(out []outcome) summary {
	var s summary
	var lat []time.Duration
	for _, o := range out {
		switch o.code {
		case http.StatusOK:
			s.ok++
			lat = append(lat, o.latency)
		case http.StatusServiceUnavailable:
			s.shed++
			s.shedMax = max(s.shedMax, o.latency)
			if o.retryAfter != "1" {
				s.badRetryAfter++
			}
		case 0:
			s.timeout++
		}
	}
	s.p50, s.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	return s
}

func (s summary) String() string {
	return fmt.Sprintf("200=%d 503=%d timeout=%d p50_ok=%dms p99_ok=%dms",
		s.ok, s.shed, s.timeout, s.p50.Milliseconds(), s.p99.Milliseconds())
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	i := int(q*float64(len(d))+0.5) - 1
	return d[max(0, min(i, len(d)-1))]
}

func get(header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r
}
