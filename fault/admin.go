package fault

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
)

// AdminConfig configures the admin endpoint. The zero AdminConfig serves
// loopback clients only. It is a plain value, copied by Admin.
type AdminConfig struct {
	// AllowRemote lets clients other than loopback ones read and change the
	// rules. Zero (false) answers them 403: whoever reaches the admin
	// endpoint can break every request the Injector sees.
	AllowRemote bool
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
// keep their counters across a PUT when their name stays. The handler is
// safe for concurrent use.
func (in *Injector) Admin(cfg AdminConfig) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", in.adminGet)
	mux.HandleFunc("GET /rules", in.adminGet)
	mux.HandleFunc("PUT /rules", in.adminPut)
	mux.HandleFunc("POST /rules", in.adminPut)
	mux.HandleFunc("POST /counters/reset", func(w http.ResponseWriter, r *http.Request) {
		in.resetCounters()
		in.adminGet(w, r)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !cfg.AllowRemote && !isLoopback(r.RemoteAddr) {
			http.Error(w, "fault: admin endpoint serves loopback clients only", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
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
