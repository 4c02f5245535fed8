package ratelimit_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/extra/ratelimit"
)

// fromAddr sends one request from the peer address addr and returns the
// status.
func fromAddr(h http.Handler, addr string) int {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = addr
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// Every address of one IPv6 /64 is one client by default: a host picks
// any of its 2^64 addresses at will, so 1,000 of them at a rate of 1 per
// second get the burst, not 1,000 requests.
func TestDefaultKeyAggregatesIPv6Slash64(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, ratelimit.Config{Rate: 1, Burst: 5})
		h := l.Middleware(http.NotFoundHandler())
		admitted := 0
		for i := range 1000 {
			addr := "[2001:db8:1:2:" + strconv.FormatUint(uint64(i)*7919%65536, 16) + ":" + strconv.Itoa(i%10) + "::1]:" + strconv.Itoa(1024+i)
			if fromAddr(h, addr) == http.StatusNotFound {
				admitted++
			}
		}
		if admitted != 5 {
			t.Errorf("1,000 addresses of 2001:db8:1:2::/64: %d admitted; want the burst, 5", admitted)
		}
		// The next /64 is another client.
		if c := fromAddr(h, "[2001:db8:1:3::1]:80"); c != http.StatusNotFound {
			t.Errorf("another /64: %d; want admitted", c)
		}
		// A second later the /64 has one more token, shared by all its
		// addresses.
		time.Sleep(time.Second)
		if c := fromAddr(h, "[2001:db8:1:2:ffff::9]:80"); c != http.StatusNotFound {
			t.Errorf("after 1s: %d; want admitted", c)
		}
		if c := fromAddr(h, "[2001:db8:1:2::10]:80"); c != http.StatusTooManyRequests {
			t.Errorf("after 1s, second address: %d; want 429", c)
		}
	})
}

// An IPv4 client is the same client whether it arrives over IPv4 or as an
// IPv4-mapped IPv6 address (a dual-stack listener), and not part of the
// ::ffff:0:0/64 of every other IPv4 client.
func TestDefaultKeyIPv4Mapped(t *testing.T) {
	l := mustNew(t, ratelimit.Config{Rate: 1, Burst: 1})
	h := l.Middleware(http.NotFoundHandler())
	if c := fromAddr(h, "192.0.2.1:1234"); c != http.StatusNotFound {
		t.Fatalf("IPv4: %d", c)
	}
	if c := fromAddr(h, "[::ffff:192.0.2.1]:1234"); c != http.StatusTooManyRequests {
		t.Errorf("the same address, IPv4-mapped: %d; want 429 (one client)", c)
	}
	if c := fromAddr(h, "[::ffff:192.0.2.2]:1234"); c != http.StatusNotFound {
		t.Errorf("another IPv4 address, IPv4-mapped: %d; want admitted (IPv4 is per address)", c)
	}
	if c := fromAddr(h, "192.0.2.3:1"); c != http.StatusNotFound {
		t.Errorf("another IPv4 address: %d; want admitted", c)
	}
}

// A client flooding junk keys cannot push its own bucket out of a full
// table and start again with a full one: a bucket that is spending is
// never dropped for a new key.
func TestJunkKeysCannotResetAbuser(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s served
		const maxKeys = 16
		l := mustNew(t, ratelimit.Config{Key: headerKey, Rate: 1, Burst: 1, MaxKeys: maxKeys})
		h := l.Middleware(&s)
		junk := 0
		for round := range 10 {
			send(h, "abuser")
			for range 100 {
				send(h, "junk-"+strconv.Itoa(junk))
				junk++
			}
			if n := ratelimit.Len(l); n > maxKeys {
				t.Fatalf("round %d: Len = %d; want at most %d", round, n, maxKeys)
			}
		}
		if got := s.n["abuser"]; got != 1 {
			t.Errorf("abuser admitted %d of 10 in one instant; want its burst, 1", got)
		}
	})
}

// IPv6PrefixBits sets how IPv6 addresses are grouped: 128 is one bucket
// per address, 48 one per /48.
func TestIPv6PrefixBits(t *testing.T) {
	for _, tc := range []struct {
		bits     int
		a, b     string
		together bool
	}{
		{0, "[2001:db8:0:1::1]:80", "[2001:db8:0:1:ffff:ffff:ffff:ffff]:80", true},
		{0, "[2001:db8:0:1::1]:80", "[2001:db8:0:2::1]:80", false},
		{64, "[2001:db8:0:1::1]:80", "[2001:db8:0:1::2]:80", true},
		{128, "[2001:db8:0:1::1]:80", "[2001:db8:0:1::2]:80", false},
		{48, "[2001:db8:0:1::1]:80", "[2001:db8:0:ffff::1]:80", true},
		{48, "[2001:db8:0:1::1]:80", "[2001:db8:1:1::1]:80", false},
		// IPv4 is per address whatever the IPv6 prefix.
		{1, "192.0.2.1:80", "192.0.2.2:80", false},
		{1, "[::ffff:192.0.2.1]:80", "192.0.2.1:81", true},
		// IPv4 is not an IPv6 prefix: ::/1 holds ::ffff:0:0/96, but an
		// IPv4 client is not charged to it.
		{1, "192.0.2.1:80", "[::1]:80", false},
	} {
		l := mustNew(t, ratelimit.Config{Rate: 1, Burst: 1, IPv6PrefixBits: tc.bits})
		h := l.Middleware(http.NotFoundHandler())
		if c := fromAddr(h, tc.a); c != http.StatusNotFound {
			t.Errorf("/%d: %s: %d; want admitted", tc.bits, tc.a, c)
		}
		want := http.StatusNotFound
		if tc.together {
			want = http.StatusTooManyRequests
		}
		if c := fromAddr(h, tc.b); c != want {
			t.Errorf("/%d: %s after %s: %d; want %d", tc.bits, tc.b, tc.a, c, want)
		}
	}
}

// Every spelling of one address is one client (zone, brackets, port or
// none), and whatever is not an address shares one bucket, so that a peer
// address copied from a header cannot buy a bucket per junk value.
func TestDefaultKeyForms(t *testing.T) {
	l := mustNew(t, ratelimit.Config{Rate: 1, Burst: 1})
	h := l.Middleware(http.NotFoundHandler())
	for i, addr := range []string{"[fe80::1%eth0]:80", "fe80::1", "[fe80::2]", "fe80::3%2", "[fe80::4]:http", "[fe80::5]:99999"} {
		want := http.StatusTooManyRequests
		if i == 0 {
			want = http.StatusNotFound
		}
		if c := fromAddr(h, addr); c != want {
			t.Errorf("%q: %d; want %d", addr, c, want)
		}
	}
	for i, addr := range []string{"garbage", "", "@", "example.com:80", "[::1", "1.2.3.4.5:6", "::ffff:1.2.3.400"} {
		want := http.StatusTooManyRequests
		if i == 0 {
			want = http.StatusNotFound
		}
		if c := fromAddr(h, addr); c != want {
			t.Errorf("%q: %d; want %d (the one bucket of non-addresses)", addr, c, want)
		}
	}
	if c := fromAddr(h, "192.0.2.1"); c != http.StatusNotFound {
		t.Errorf("an IPv4 address without a port: %d; want admitted (its own bucket)", c)
	}
}

// An abuser that keeps sending, and floods new keys between its requests,
// gets its rate and no more: its bucket is never dropped while it spends,
// whereas the junk keys, whose buckets refill, make room for each other.
func TestJunkFloodOverTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s served
		const maxKeys = 32
		l := mustNew(t, ratelimit.Config{Key: headerKey, Rate: 10, Burst: 10, MaxKeys: maxKeys})
		h := l.Middleware(&s)
		junk := 0
		const seconds = 10
		for range seconds * 100 { // every 10 ms
			send(h, "abuser")
			for range 50 {
				send(h, "junk-"+strconv.Itoa(junk))
				junk++
			}
			time.Sleep(10 * time.Millisecond)
		}
		if got, lo, hi := s.n["abuser"], 10+10*seconds-1, 10+10*seconds+1; got < lo || got > hi {
			t.Errorf("abuser admitted %d of %d; want its burst and rate, %d..%d", got, seconds*100, lo, hi)
		}
		if n := ratelimit.Len(l); n > maxKeys {
			t.Errorf("Len = %d; want at most %d", n, maxKeys)
		}
		// A junk key's bucket refills after 100 ms: the junk sent in the
		// last 100 ms (5,000 keys) holds the table, and anything older
		// was replaced once it had refilled.
		if got := len(s.n) - 1; got < 2*maxKeys {
			t.Errorf("%d distinct junk keys admitted; want keys of refilled buckets replaced (at least %d)", got, 2*maxKeys)
		}
	})
}

// When the table is full of keys that are spending, a new key shares the
// shard's overflow bucket, with an honest Retry-After; once the old keys'
// buckets have refilled, new keys get buckets of their own.
func TestFullTableOverflow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxKeys = 16 // one shard
		l := mustNew(t, ratelimit.Config{Key: headerKey, Rate: 1, Burst: 2, MaxKeys: maxKeys})
		h := l.Middleware(http.NotFoundHandler())
		for i := range maxKeys {
			if c := send(h, "old-"+strconv.Itoa(i)).Code; c != http.StatusNotFound {
				t.Fatalf("old-%d: %d", i, c)
			}
		}
		// The overflow bucket holds Burst tokens for all new keys.
		for i, want := range []int{http.StatusNotFound, http.StatusNotFound, http.StatusTooManyRequests} {
			w := send(h, "new-"+strconv.Itoa(i))
			if w.Code != want {
				t.Errorf("new-%d in a full table: %d; want %d", i, w.Code, want)
			}
			if want == http.StatusTooManyRequests && w.Header().Get("Retry-After") != "1" {
				t.Errorf("new-%d: Retry-After %q; want 1", i, w.Header().Get("Retry-After"))
			}
		}
		// Every old key kept its bucket: each has one token left.
		for i := range maxKeys {
			if c := send(h, "old-"+strconv.Itoa(i)).Code; c != http.StatusNotFound {
				t.Errorf("old-%d, second request: %d; want admitted (its bucket kept)", i, c)
			}
			if c := send(h, "old-"+strconv.Itoa(i)).Code; c != http.StatusTooManyRequests {
				t.Errorf("old-%d, third request: %d; want 429 (its bucket kept)", i, c)
			}
		}
		// Two seconds later the old buckets are full again and give way.
		time.Sleep(2 * time.Second)
		for i := range 5 {
			for j := range 2 {
				if c := send(h, "later-"+strconv.Itoa(i)).Code; c != http.StatusNotFound {
					t.Errorf("later-%d, request %d: %d; want admitted (a bucket of its own)", i, j, c)
				}
			}
		}
		if n := ratelimit.Len(l); n > maxKeys {
			t.Errorf("Len = %d; want at most %d", n, maxKeys)
		}
	})
}

// Under concurrency too, a flood of new keys in a full table neither
// resets a spending bucket nor grows the table.
func TestJunkFloodConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxKeys = 64
		l := mustNew(t, ratelimit.Config{Rate: 1, Burst: 3, MaxKeys: maxKeys})
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 200 {
					if l.Allow("abuser") == nil {
						admitted.Add(1)
					}
					for j := range 50 {
						l.Allow("junk-" + strconv.Itoa(g) + "-" + strconv.Itoa(i) + "-" + strconv.Itoa(j))
					}
				}
			})
		}
		wg.Wait()
		if got := admitted.Load(); got != 3 {
			t.Errorf("abuser admitted %d of 1600 in one instant; want its burst, 3", got)
		}
		if n := ratelimit.Len(l); n > maxKeys {
			t.Errorf("Len = %d; want at most %d", n, maxKeys)
		}
	})
}
