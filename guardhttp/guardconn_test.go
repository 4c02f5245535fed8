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

// wantState checks the connection's state, and that its due time is
// limit after a moment between before and now (0: not timed).
func wantState(t *testing.T, c *guardConn, state int, before int64, limit time.Duration) {
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
	if lo, hi := before+int64(limit), nanotime()+int64(limit); d < lo || d > hi {
		t.Fatalf("due %d, want %v from a moment in [%d, %d]", d, limit, before, hi-int64(limit))
	}
}

func TestGuardConnPhases(t *testing.T) {
	t.Run("request without a body", func(t *testing.T) {
		c := newTestConn()
		t0 := nanotime()
		c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		wantState(t, c, connAwaiting, t0, c.header) // written: the response is awaited
		c.arrived([]byte("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 2"))
		wantState(t, c, connHeaders, t0, c.header) // the same phase goes on
		c.arrived([]byte("00 OK\r\nContent-Length: 2\r\n\r\nok"))
		wantState(t, c, connIdle, 0, 0)
		c.arrived([]byte("HTTP/1.1 200 OK\r\n\r\n")) // body bytes are not looked at
		wantState(t, c, connIdle, 0, 0)
		t1 := nanotime()
		c.Write([]byte("GET /next HTTP/1.1\r\n\r\n"))
		wantState(t, c, connAwaiting, t1, c.header) // the next request
	})
	t.Run("response before the write returned", func(t *testing.T) {
		c := newTestConn()
		c.sniffed = true
		t0 := nanotime()
		c.writing(nil)
		wantState(t, c, connWriting, t0, c.write)
		t1 := nanotime()
		c.arrived([]byte("HTTP/1.1 200 OK\r\n"))
		wantState(t, c, connHeaders, t1, c.header)
		c.written() // the write returns late: nothing changes
		wantState(t, c, connHeaders, t1, c.header)
	})
	t.Run("request with a body and 100 Continue", func(t *testing.T) {
		c := newTestConn()
		t0 := nanotime()
		c.begin()
		wantState(t, c, connWriting, t0, c.write)
		c.Write([]byte("PUT / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n"))
		wantState(t, c, connWriting, t0, c.write) // the body is still to come
		t1 := nanotime()
		c.arrived([]byte("HTTP/1.1 100 Continue\r\n\r\n"))
		wantState(t, c, connWriting, t1, c.write) // the body has a write limit of its own
		c.Write([]byte("body"))
		wantState(t, c, connWriting, t1, c.write)
		t2 := nanotime()
		c.wrote(nil)
		wantState(t, c, connAwaiting, t2, c.header)
		c.arrived([]byte("HTTP/1.1 201 Created\r\n\r\n"))
		wantState(t, c, connIdle, 0, 0)
		t3 := nanotime()
		c.Write([]byte("GET / HTTP/1.1\r\n\r\n")) // a request without a body next
		wantState(t, c, connAwaiting, t3, c.header)
	})
	t.Run("TLS and HTTP/2 are not timed", func(t *testing.T) {
		for _, first := range [][]byte{{0x16, 0x03, 0x01}, []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")} {
			c := newTestConn()
			c.Write(first)
			wantState(t, c, connOff, 0, 0)
			c.Write([]byte("more"))
			c.arrived([]byte("HTTP/1.1 200 OK\r\n\r\n"))
			wantState(t, c, connOff, 0, 0)
		}
	})
	t.Run("switched protocols", func(t *testing.T) {
		c := newTestConn()
		c.begin()
		c.wrote(nil)
		c.arrived([]byte("HTTP/1.1 101 Switching Protocols\r\n\r\n"))
		wantState(t, c, connIdle, 0, 0) // 101 is final
		c.off()
		c.Write([]byte("frames of another protocol"))
		wantState(t, c, connOff, 0, 0)
	})
	t.Run("the watchdog ends an expired phase", func(t *testing.T) {
		c := newTestConn()
		c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		w := c.word.Load()
		if !c.check(dueOf(w) - 1) {
			t.Fatal("check before the due time ended the phase")
		}
		wantState(t, c, connAwaiting, 0, c.header)
		if c.check(dueOf(w)) {
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
