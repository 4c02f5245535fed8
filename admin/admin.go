// Package admin guards operator endpoints against requests a browser was
// tricked into sending.
package admin

import (
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ErrInvalidConfig is wrapped by every error New returns.
var ErrInvalidConfig = errors.New("admin: invalid config")

// Config configures a Guard. The zero Config answers loopback names and
// literal IP addresses only.
type Config struct {
	// Hosts lists the names, besides the defaults, that requests may carry
	// in their Host header: "ops.example.com" matches on any port,
	// "ops.example.com:8443" on that port only. Matching ignores case and
	// a trailing dot. "localhost", names under ".localhost" and literal IP
	// addresses are always accepted: a browser resolves the first two to
	// loopback, and a page can only reach a literal address under that
	// address's own origin, so none of them lets a page on a name an
	// attacker controls be rebound to the endpoint.
	Hosts []string
}

// Guard refuses what a browser sends on behalf of another site to an
// operator endpoint, before the endpoint sees it:
//
//   - a Host header outside Config.Hosts and the defaults: 403, which
//     defeats DNS rebinding, where a page on an attacker's name is
//     re-pointed at the endpoint's address and reads or changes it as
//     its own origin;
//   - a cross-origin request that is not GET, HEAD or OPTIONS, told by
//     Sec-Fetch-Site or by an Origin that differs from the Host
//     (http.CrossOriginProtection): 403;
//   - a request that is not GET, HEAD or OPTIONS and carries a body or a
//     Content-Type other than application/json: 415, since a cross-site
//     form or a no-CORS fetch can only send the simple types.
//
// Requests from programs (curl, scripts, other services) carry none of
// the browser headers and pass. A Guard does not authenticate: put the
// endpoint's own authorization after it. A Guard is safe for concurrent
// use.
type Guard struct {
	names map[string]bool // host names, lower-case, accepted on any port
	pairs map[string]bool // host:port pairs, lower-case
	csrf  *http.CrossOriginProtection
}

// New returns a Guard for cfg, or an error wrapping ErrInvalidConfig that
// names every entry of Hosts that is not a host name or a host:port.
func New(cfg Config) (*Guard, error) {
	g := &Guard{
		names: make(map[string]bool),
		pairs: make(map[string]bool),
		csrf:  http.NewCrossOriginProtection(),
	}
	var errs []error
	for i, h := range cfg.Hosts {
		host, port, err := splitHost(h)
		if err != nil || host == "" {
			errs = append(errs, fmt.Errorf("Config.Hosts[%d] is %q; want a host name or host:port", i, h))
			continue
		}
		if port == "" {
			g.names[host] = true
		} else {
			g.pairs[net.JoinHostPort(host, port)] = true
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	g.csrf.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "admin: cross-origin request refused", http.StatusForbidden)
	}))
	return g, nil
}

// Middleware returns next behind the Guard.
func (g *Guard) Middleware(next http.Handler) http.Handler {
	protected := g.csrf.Handler(next) // built once, not per request
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.hostAllowed(r.Host) {
			http.Error(w, "admin: unexpected Host header", http.StatusForbidden)
			return
		}
		if !safeMethod(r.Method) && !jsonOrEmpty(r) {
			http.Error(w, "admin: want Content-Type: application/json", http.StatusUnsupportedMediaType)
			return
		}
		protected.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether a Host header value names the endpoint.
func (g *Guard) hostAllowed(hostport string) bool {
	host, port, err := splitHost(hostport)
	if err != nil || host == "" {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	return g.names[host] || (port != "" && g.pairs[net.JoinHostPort(host, port)])
}

// splitHost splits a Host value or a Config.Hosts entry into its
// lower-case host, without brackets or a trailing dot, and its port.
func splitHost(s string) (host, port string, err error) {
	if strings.ContainsAny(s, " \t\r\n/@?#\\") {
		return "", "", errors.New("not a host")
	}
	host = s
	if i := strings.LastIndexByte(s, ':'); i >= 0 && !strings.Contains(s[i:], "]") {
		if h, p, err := net.SplitHostPort(s); err == nil {
			host, port = h, p
		} else if strings.Count(s, ":") == 1 || strings.HasPrefix(s, "[") {
			return "", "", err
		}
		// Otherwise a bare IPv6 address without brackets.
	}
	host = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
	if strings.ContainsAny(host, "[]") {
		return "", "", errors.New("stray bracket")
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return "", "", errors.New("bad port")
		}
	}
	return strings.ToLower(host), port, nil
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// jsonOrEmpty reports whether a state-changing request carries either no
// body and no Content-Type, or a JSON one.
func jsonOrEmpty(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
