package fault

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/guardrail-go/guardrail/admin"
)

// AdminConfig configures the admin endpoint. The zero AdminConfig serves
// loopback clients that name it by a loopback name or an IP address. It is
// a plain value, copied by Admin.
type AdminConfig struct {
	// AllowRemote lets clients other than loopback ones read and change the
	// rules. Zero (false) answers them 403: whoever reaches the admin
	// endpoint can break every request the Injector sees.
	AllowRemote bool
	// Hosts lists the names, besides localhost, names under .localhost and
	// literal IP addresses, that requests may carry in their Host header:
	// "ops.example.com" on any port, "ops.example.com:8443" on that port
	// only (see admin.Config.Hosts). A request with any other Host gets
	// 403, so that a web page on a name its author controls cannot be
	// rebound to the endpoint's address. Nil means none.
	Hosts []string
}

// Admin returns the admin endpoint of in, an http.Handler to mount on its
// own listener (preferably on loopback):
//
//	GET  /            the configuration and counters (same as GET /rules)
//	GET  /rules       {"header_faults":..., "header":..., "rules":[...], "counters":[...]}
//	PUT  /rules       replace the whole configuration with the body, a config
//	POST /rules       file in JSON (see ParseConfig); a seed in it
//	                  reseeds the random source; answers like GET, or 400
//	                  with the error naming the rule and field
//	POST /counters/reset   set every counter to zero; answers like GET
//
// The answer of GET is a valid config file: edit it and PUT it back. Rules
// keep their counters across a PUT when their name stays.
//
// Every request passes an admin.Guard first, since a web page open in a
// browser on the same machine is a loopback client too: a Host outside
// the defaults and cfg.Hosts gets 403, a cross-origin request that is not
// GET, HEAD or OPTIONS gets 403, and a PUT or POST whose body is not
// Content-Type: application/json gets 415. Programs such as curl pass
// when they send the JSON type. The handler is safe for concurrent use.
//
// Admin returns an error wrapping ErrInvalidConfig that names every entry
// of cfg.Hosts that is not a host name or host:port.
func (in *Injector) Admin(cfg AdminConfig) (http.Handler, error) {
	var errs []error
	for i, h := range cfg.Hosts {
		if _, err := admin.New(admin.Config{Hosts: []string{h}}); err != nil {
			errs = append(errs, fmt.Errorf("AdminConfig.Hosts[%d] is %q; want a host name or host:port", i, h))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	guard, err := admin.New(admin.Config{Hosts: cfg.Hosts})
	if err != nil { // cannot happen: every entry passed alone
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", in.adminGet)
	mux.HandleFunc("GET /rules", in.adminGet)
	mux.HandleFunc("PUT /rules", in.adminPut)
	mux.HandleFunc("POST /rules", in.adminPut)
	mux.HandleFunc("POST /counters/reset", func(w http.ResponseWriter, r *http.Request) {
		in.resetCounters()
		in.adminGet(w, r)
	})
	guarded := guard.Middleware(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !cfg.AllowRemote && !isLoopback(r.RemoteAddr) {
			http.Error(w, "fault: admin endpoint serves loopback clients only", http.StatusForbidden)
			return
		}
		guarded.ServeHTTP(w, r)
	}), nil
}

func (in *Injector) adminGet(w http.ResponseWriter, _ *http.Request) {
	body, err := json.MarshalIndent(in.Config().file(in.Counters()), "", "  ")
	if err != nil { // cannot happen: the rules are valid
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(append(body, '\n'))
}

func (in *Injector) adminPut(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxConfigSize))
	if err != nil {
		status := http.StatusBadRequest
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			status = http.StatusRequestEntityTooLarge
		}
		http.Error(w, "fault: reading the body: "+err.Error(), status)
		return
	}
	cfg, err := ParseConfig(data)
	if err == nil {
		err = in.Reconfigure(cfg)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	in.adminGet(w, r)
}

// isLoopback reports whether a RemoteAddr ("host:port") is a loopback
// address.
func isLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	host, _, _ = strings.Cut(host, "%") // IPv6 zone
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
