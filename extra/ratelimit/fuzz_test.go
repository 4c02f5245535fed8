package ratelimit_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/guardrail-go/guardrail/extra/ratelimit"
)

// FuzzKey: arbitrary header values and peer addresses, with the header
// key function and the default one, never panic, are answered 200 or 429,
// and never grow the table past MaxKeys.
func FuzzKey(f *testing.F) {
	f.Add("alice", "192.0.2.1:80")
	f.Add("", "")
	f.Add("\x00\xff\r\n", "[::1")
	f.Add(string(make([]byte, 1<<16)), "[2001:db8::1]:0")
	const maxKeys = 64
	byHeader := mustNew(f, ratelimit.Config{Key: headerKey, Rate: 1, Burst: 1, MaxKeys: maxKeys})
	byAddr := mustNew(f, ratelimit.Config{Rate: 1, Burst: 1, MaxKeys: maxKeys})
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	handlers := []http.Handler{byHeader.Middleware(ok), byAddr.Middleware(ok)}
	f.Fuzz(func(t *testing.T, header, addr string) {
		for _, h := range handlers {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header["X-Client"] = []string{header}
			r.RemoteAddr = addr
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK && w.Code != http.StatusTooManyRequests {
				t.Fatalf("status %d", w.Code)
			}
		}
		if n, m := ratelimit.Len(byHeader), ratelimit.Len(byAddr); n > maxKeys || m > maxKeys {
			t.Fatalf("Len = %d, %d; want at most %d", n, m, maxKeys)
		}
	})
}

// FuzzClientPrefix: the default key's reading of a peer address never
// panics, never loses an address that net.SplitHostPort and netip read (it
// would be charged to the shared bucket of non-addresses), and gives one
// client per IPv4 address and per IPv6 prefix: a masked prefix without a
// zone, IPv4-mapped addresses unmapped, that every address in it maps to.
func FuzzClientPrefix(f *testing.F) {
	for _, s := range []string{
		"192.0.2.1:80", "192.0.2.1", "[2001:db8::1]:443", "2001:db8::1", "[2001:db8::1]",
		"[fe80::1%eth0]:80", "fe80::1%25eth0", "[::ffff:192.0.2.1]:1", "::ffff:c000:201",
		"[1.2.3.4]:80", "1.2.3.4:99999", "[::1]:http", "", "@", "[", "[]", "[::1", "::1]",
		"garbage", "example.com:80", "1.2.3.4.5", "[::1]:80:80", "%", "[%]:1", "::%\x00",
	} {
		f.Add(s, uint8(64))
	}
	f.Add("[2001:db8::1]:1", uint8(128))
	f.Add("[2001:db8::1]:1", uint8(1))
	f.Fuzz(func(t *testing.T, remote string, bits uint8) {
		v6bits := int(bits%128) + 1
		p, ok := ratelimit.ClientPrefix(remote, v6bits)
		want, known := knownAddr(remote)
		if known && !ok {
			t.Fatalf("ClientPrefix(%q) refused the address %v", remote, want)
		}
		if !ok {
			return
		}
		a := p.Addr()
		switch {
		case !p.IsValid() || p != p.Masked() || a.Zone() != "":
			t.Fatalf("ClientPrefix(%q) = %v; want a masked prefix without a zone", remote, p)
		case a.Is4() && p.Bits() != 32, a.Is6() && p.Bits() != v6bits, a.Is4In6():
			t.Fatalf("ClientPrefix(%q, %d) = %v; want a /32 or, unmapped, a /%d", remote, v6bits, p, v6bits)
		case known && !p.Contains(want):
			t.Fatalf("ClientPrefix(%q) = %v; want the prefix of %v", remote, p, want)
		}
		// Any spelling of an address of the prefix is the same client.
		for _, again := range []string{netip.AddrPortFrom(a, 443).String(), a.String()} {
			if q, ok := ratelimit.ClientPrefix(again, v6bits); !ok || q != p {
				t.Fatalf("ClientPrefix(%q) = %v, %v; want %v, as for %q", again, q, ok, p, remote)
			}
		}
	})
}

// knownAddr reads remote with the standard library alone: an address,
// with a port or not, its zone dropped and unmapped.
func knownAddr(remote string) (netip.Addr, bool) {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	return a.WithZone("").Unmap(), err == nil
}
