package guardhttp

import (
	"net"
	"testing"
	"time"
)

// sink is a net.Conn whose writes succeed at once.
type sink struct{ net.Conn }

func (sink) Write(p []byte) (int, error) { return len(p), nil }
func (sink) Close() error                { return nil }

// newTestConn returns a guardConn over a sink. Its watchdog watches
// nothing: the ticks that its phases wake stop at once.
func newTestConn() *guardConn {
	return &guardConn{Conn: sink{}, w: newWatchdog(time.Hour), write: time.Minute, header: 2 * time.Minute}
}

// wantState checks the connection's state, and that its phase is timed
// with limit: pending until the watchdog's look (check) gives it a due
// time limit after the clock that look reads. limit 0: not timed.
func wantState(t *testing.T, c *guardConn, state int, limit time.Duration) {
	t.Helper()
	w := c.word.Load()
	if got := stateOf(w); got != state {
		t.Fatalf("state %d, want %d", got, state)
	}
	d := dueOf(w)
	if limit == 0 {
		if d != 0 {
			t.Fatalf("due %d, want none", d)
		}
		return
	}
	if d >= 0 {
		t.Fatalf("due %d, want a pending marker", d)
	}
	const at = 1000
	if !c.check(0, func() int64 { return at }) {
		t.Fatal("check: not timed")
	}
	if got := c.word.Load(); got != word(state, at+int64(limit)) {
		t.Fatalf("after check: state %d due %d, want %d due %d", stateOf(got), dueOf(got), state, at+int64(limit))
	}
	c.word.Store(w) // as it was, for what the test does next
}

// wantStamped checks the connection's state and due time.
func wantStamped(t *testing.T, c *guardConn, state int, due int64) {
	t.Helper()
	if got := c.word.Load(); got != word(state, due) {
		t.Fatalf("state %d due %d, want %d due %d", stateOf(got), dueOf(got), state, due)
	}
}

// Markers are unique: a look that saw one phase cannot time a later one.
func TestGuardConnPendingMarkersAreUnique(t *testing.T) {
	c := newTestConn()
	c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	seen := c.word.Load() // a look at the first request's wait
	c.arrived([]byte("HTTP/1.1 200 OK\r\n\r\n"))
	c.Write([]byte("GET / HTTP/1.1\r\n\r\n")) // the next request waits too
	if c.word.CompareAndSwap(seen, word(connAwaiting, 1)) {
		t.Fatal("the first request's marker matched the second's")
	}
}

func TestGuardConnPhases(t *testing.T) {
	t.Run("request without a body", func(t *testing.T) {
		c := newTestConn()
		c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		wantState(t, c, connAwaiting, c.header) // written: the response is awaited
		c.arrived([]byte("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 2"))
		wantState(t, c, connHeaders, c.header) // the same phase goes on
		c.arrived([]byte("00 OK\r\nContent-Length: 2\r\n\r\nok"))
		wantState(t, c, connIdle, 0)
		c.arrived([]byte("HTTP/1.1 200 OK\r\n\r\n")) // body bytes are not looked at
		wantState(t, c, connIdle, 0)
		c.Write([]byte("GET /next HTTP/1.1\r\n\r\n"))
		wantState(t, c, connAwaiting, c.header) // the next request
	})
	t.Run("response before the write returned", func(t *testing.T) {
		c := newTestConn()
		c.sniffed = true
		c.writing(nil)
		wantState(t, c, connWriting, c.write)
		c.arrived([]byte("HTTP/1.1 200 OK\r\n"))
		wantState(t, c, connHeaders, c.header)
		c.written(nil) // the write returns late: nothing changes
		wantState(t, c, connHeaders, c.header)
	})
	t.Run("request with a body and 100 Continue", func(t *testing.T) {
		c := newTestConn()
		c.begin()
		wantState(t, c, connWriting, c.write)
		c.Write([]byte("PUT / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n"))
		wantState(t, c, connWriting, c.write) // the body is still to come
		c.arrived([]byte("HTTP/1.1 100 Continue\r\n\r\n"))
		wantState(t, c, connWriting, c.write) // the body has a write limit of its own
		c.Write([]byte("body"))
		wantState(t, c, connWriting, c.write)
		c.wrote(nil)
		wantState(t, c, connAwaiting, c.header)
		c.arrived([]byte("HTTP/1.1 201 Created\r\n\r\n"))
		wantState(t, c, connIdle, 0)
		c.Write([]byte("GET / HTTP/1.1\r\n\r\n")) // a request without a body next
		wantState(t, c, connAwaiting, c.header)
	})
	t.Run("early answer", func(t *testing.T) {
		c := newTestConn()
		c.begin()
		c.Write([]byte("PUT / HTTP/1.1\r\nContent-Length: 4\r\n\r\n"))
		c.arrived([]byte("HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\n\r\n"))
		wantState(t, c, connIdle, 0)
		c.Write([]byte("body")) // the rest of the body, after the answer
		wantState(t, c, connIdle, 0)
		c.wrote(nil)
		wantState(t, c, connIdle, 0) // back in the pool untimed
		c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		wantState(t, c, connAwaiting, c.header) // the next request is timed
	})
	t.Run("TLS and HTTP/2 are not timed", func(t *testing.T) {
		for _, first := range [][]byte{{0x16, 0x03, 0x01}, []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")} {
			c := newTestConn()
			c.Write(first)
			wantState(t, c, connOff, 0)
			c.Write([]byte("more"))
			c.arrived([]byte("HTTP/1.1 200 OK\r\n\r\n"))
			wantState(t, c, connOff, 0)
		}
	})
	t.Run("switched protocols", func(t *testing.T) {
		c := newTestConn()
		c.begin()
		c.wrote(nil)
		c.arrived([]byte("HTTP/1.1 101 Switching Protocols\r\n\r\n"))
		wantState(t, c, connIdle, 0) // 101 is final
		c.off()
		c.Write([]byte("frames of another protocol"))
		wantState(t, c, connOff, 0)
	})
	t.Run("the watchdog ends an expired phase", func(t *testing.T) {
		c := newTestConn()
		c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		const at = 5000
		clock := func() int64 { return at }
		if !c.check(0, clock) { // the first look times the phase from at
			t.Fatal("check found nothing timed")
		}
		due := at + int64(c.header)
		if !c.check(due-1, clock) {
			t.Fatal("check before the due time ended the phase")
		}
		wantStamped(t, c, connAwaiting, due)
		if c.check(due, clock) {
			t.Fatal("check at the due time left the phase running")
		}
		te, from := c.timedOut()
		if te == nil || te.phase != phaseHeader || from != connAwaiting {
			t.Fatalf("timedOut = %v, %d; want a response-header timeout from awaiting", te, from)
		}
		c.arrived([]byte("HTTP/1.1 200 OK\r\n\r\n")) // too late: stays dead
		if te, _ := c.timedOut(); te == nil {
			t.Fatal("a late response revived the connection")
		}
	})
}
