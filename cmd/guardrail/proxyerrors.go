package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"sync"
	"time"
)

// proxyErrorInterval is how often a burst of proxy errors is summarised,
// the default interval of guardrail's log observer: an upstream that is
// down fails every request, and one line per request would bury the rest
// of the log (a hundred lines in two seconds).
const proxyErrorInterval = 10 * time.Second

// errorSummary logs the fault proxy's errors in bursts, as guardrail's
// log observer does for rejections: the first error after a quiet interval
// at once, then at most one line per interval with the count and the last
// error while errors go on, and one line when a whole interval passed
// without any, with the burst's total. A lone error gets its first line
// alone. Its lines are written by a timer (time.AfterFunc) while a burst
// lasts: no goroutine is left when there is none.
//
// An errorSummary is safe for concurrent use.
type errorSummary struct {
	logger   *log.Logger
	interval time.Duration

	mu     sync.Mutex
	timer  *time.Timer // nil: no burst
	start  time.Time   // of the burst
	lastAt time.Time   // of its last error
	count  int         // errors since the last line
	total  int         // errors in the burst
	last   string      // the last error, for the next line
	closed bool
}

func newErrorSummary(w io.Writer, prefix string, interval time.Duration) *errorSummary {
	return &errorSummary{logger: log.New(w, prefix, log.LstdFlags), interval: interval}
}

// add records one error, described by msg.
func (s *errorSummary) add(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.timer == nil {
		s.start, s.total, s.count = time.Now(), 1, 0
		s.lastAt = s.start
		s.timer = time.AfterFunc(s.interval, s.tick)
		s.logger.Printf("%s (further errors summarised every %v)", msg, s.interval)
		return
	}
	s.count++
	s.total++
	s.last, s.lastAt = msg, time.Now()
}

// tick writes the summary of the interval that just ended.
func (s *errorSummary) tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.timer == nil {
		return
	}
	if s.count > 0 {
		s.logger.Printf("%d more error(s) in the last %v; last: %s", s.count, s.interval, s.last)
		s.count = 0
		s.timer.Reset(s.interval)
		return
	}
	s.end()
}

// end closes the burst: a line with its total unless it was a lone error.
func (s *errorSummary) end() {
	if s.total > 1 {
		s.logger.Printf("errors stopped: %d in %v, from the first to the last", s.total, s.lastAt.Sub(s.start).Round(time.Millisecond))
	}
	s.timer = nil
}

// Close writes what is pending of a burst in progress and stops its timer.
func (s *errorSummary) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	if s.timer == nil {
		return
	}
	s.timer.Stop()
	if s.count > 0 {
		s.logger.Printf("%d more error(s) before shutdown; last: %s", s.count, s.last)
	}
	s.end()
}

// proxyError answers a request the proxy could not forward with 502, as
// httputil.ReverseProxy does by default, and adds the error to the
// summary. A request whose client went away is not an upstream error and
// is not logged.
func (s *errorSummary) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if !errors.Is(err, context.Canceled) || r.Context().Err() == nil {
		s.add(fmt.Sprintf("upstream error: %s %s: %v", r.Method, r.URL.Path, err))
	}
	w.WriteHeader(http.StatusBadGateway)
}

// Write takes the lines that httputil.ReverseProxy logs on its own (a body
// copy that failed halfway, say) into the summary, so that they too come
// in bursts.
func (s *errorSummary) Write(p []byte) (int, error) {
	for line := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
		if line != "" {
			s.add(line)
		}
	}
	return len(p), nil
}
