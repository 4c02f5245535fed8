package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail/fault"
)

// faultFlags are the flags fault-server and fault-proxy share: where to
// listen, the admin endpoint, and the rules.
type faultFlags struct {
	listen       string
	admin        string
	allowRemote  bool
	adminHosts   []string
	rulesFile    string
	seed         uint64
	headerFaults bool
	faults       []string
	latency      time.Duration
	errorRate    float64
	status       int
	retryAfter   time.Duration
	resetRate    float64
}

func (f *faultFlags) register(fs *flag.FlagSet, listen, admin string) {
	fs.StringVar(&f.listen, "listen", listen, "address to serve on")
	fs.StringVar(&f.admin, "admin", admin, "address of the admin endpoint (rules and counters); empty disables it")
	fs.BoolVar(&f.allowRemote, "admin-allow-remote", false, "let non-loopback clients use the admin endpoint")
	fs.Func("admin-host", "a name clients may reach the admin endpoint by, besides localhost and IP addresses, e.g. ops.internal or ops.internal:8092 (repeatable)",
		func(s string) error { f.adminHosts = append(f.adminHosts, s); return nil })
	fs.StringVar(&f.rulesFile, "rules", "", "rules file, JSON or YAML")
	fs.Uint64Var(&f.seed, "seed", 0, "random seed, to replay the same faults (default: the file's seed, or a random one, printed)")
	fs.BoolVar(&f.headerFaults, "header-faults", false, "let requests ask for their own fault with the X-Fault header (unsafe outside tests)")
	fs.Func("fault", "a rule on one line, e.g. 'error; status=503; probability=0.1; path=/api/**' (repeatable)",
		func(s string) error { f.faults = append(f.faults, s); return nil })
	fs.DurationVar(&f.latency, "latency", 0, "add this delay to every request")
	fs.Float64Var(&f.errorRate, "error-rate", 0, "fraction of requests answered with --status (default 1 when --status is set)")
	fs.IntVar(&f.status, "status", 0, "error status for --error-rate (default 503)")
	fs.DurationVar(&f.retryAfter, "retry-after", 0, "Retry-After sent with --status")
	fs.Float64Var(&f.resetRate, "reset-rate", 0, "fraction of requests whose connection is reset")
}

// config builds the Injector's configuration: the --latency rule, the
// file's rules, the --fault rules, then the --reset-rate and --error-rate
// rules. It returns the seed in use
// and whether it came from the file.
func (f *faultFlags) config(fs *flag.FlagSet) (cfg fault.Config, seed uint64, fromFile bool, err error) {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if f.rulesFile != "" {
		data, err := readInputFile(f.rulesFile)
		if err != nil {
			return cfg, 0, false, err
		}
		if cfg, err = parseFaultConfig(data); err != nil {
			return cfg, 0, false, fmt.Errorf("%s: %w", f.rulesFile, err)
		}
		fromFile = cfg.Rand != nil
	}
	for i, spec := range f.faults {
		r, err := fault.ParseRule(spec)
		if err != nil {
			return cfg, 0, false, usageError{fmt.Sprintf("--fault %q: %v", spec, err)}
		}
		if r.Name == "" {
			r.Name = fmt.Sprintf("flag-fault-%d", i)
		}
		cfg.Rules = append(cfg.Rules, r)
	}
	rate := func(name string, p float64) error {
		if !(p >= 0 && p <= 1) {
			return usageError{fmt.Sprintf("--%s %v is not between 0 and 1", name, p)}
		}
		return nil
	}
	if f.latency < 0 {
		return cfg, 0, false, usageError{"--latency is negative"}
	}
	if f.latency > 0 {
		// First, so that it delays every request, even one another rule fails.
		cfg.Rules = append([]fault.Rule{{Name: "flag-latency", Fault: fault.Latency{Delay: f.latency}}}, cfg.Rules...)
	}
	if err := rate("reset-rate", f.resetRate); err != nil {
		return cfg, 0, false, err
	}
	if f.resetRate > 0 {
		cfg.Rules = append(cfg.Rules, fault.Rule{Name: "flag-reset", Probability: f.resetRate, Fault: fault.Reset{}})
	}
	if err := rate("error-rate", f.errorRate); err != nil {
		return cfg, 0, false, err
	}
	errorRate := f.errorRate
	if errorRate == 0 && !set["error-rate"] && (set["status"] || set["retry-after"]) {
		errorRate = 1
	}
	if errorRate > 0 {
		cfg.Rules = append(cfg.Rules, fault.Rule{Name: "flag-error", Probability: errorRate,
			Fault: fault.Status{Code: f.status, RetryAfter: f.retryAfter}})
	} else if set["status"] || set["retry-after"] {
		return cfg, 0, false, usageError{"--status and --retry-after need a non-zero --error-rate"}
	}
	if f.headerFaults {
		cfg.HeaderFaults = true
	}
	switch {
	case set["seed"]:
		seed, fromFile = f.seed, false
		cfg.Rand = fault.NewRand(seed)
	case cfg.Rand == nil:
		seed = rand.Uint64()
		cfg.Rand = fault.NewRand(seed)
	}
	return cfg, seed, fromFile, nil
}

// serveFaults serves app behind the Injector's middleware on --listen, and
// the admin endpoint on --admin, until ctx ends; then it releases held
// requests and shuts both servers down gracefully.
func serveFaults(ctx context.Context, name string, fs *flag.FlagSet, f *faultFlags, app http.Handler,
	stdout, stderr io.Writer) error {
	if f.admin != "" && !f.allowRemote && !loopbackAddr(f.admin) {
		return usageError{fmt.Sprintf("--admin %s is not a loopback address; add --admin-allow-remote to expose the admin endpoint", f.admin)}
	}
	cfg, seed, fromFile, err := f.config(fs)
	if err != nil {
		return err
	}
	in, err := fault.New(cfg)
	if err != nil {
		if re, ok := errors.AsType[*fault.RuleError](err); ok && strings.HasPrefix(re.Name, "flag-") {
			return usageError{err.Error()} // a quick flag's value
		}
		return err
	}
	defer in.Close()

	var adminHandler http.Handler
	if f.admin != "" {
		if adminHandler, err = f.adminEndpoint(in); err != nil {
			return err
		}
	}

	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	logger := log.New(stderr, "guardrail "+name+": ", log.LstdFlags)
	srv := &http.Server{Handler: in.Middleware(app), ReadHeaderTimeout: 10 * time.Second, ErrorLog: logger}
	servers := []*http.Server{srv}
	listeners := []net.Listener{ln}
	if f.admin != "" {
		aln, err := net.Listen("tcp", f.admin)
		if err != nil {
			ln.Close()
			return err
		}
		servers = append(servers, &http.Server{Handler: adminHandler,
			ReadHeaderTimeout: 10 * time.Second, ErrorLog: logger})
		listeners = append(listeners, aln)
	}

	fmt.Fprintf(stdout, "%s listening on %s\n", name, ln.Addr())
	if len(listeners) > 1 {
		fmt.Fprintf(stdout, "admin listening on %s\n", listeners[1].Addr())
	}
	if fromFile {
		fmt.Fprintf(stdout, "seed from %s, %d rule(s)\n", f.rulesFile, len(cfg.Rules))
	} else {
		fmt.Fprintf(stdout, "seed %d, %d rule(s)\n", seed, len(cfg.Rules))
	}

	var wg sync.WaitGroup
	errc := make(chan error, len(servers))
	for i, s := range servers {
		wg.Go(func() {
			if err := s.Serve(listeners[i]); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		})
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc: // a listener failed
	}
	in.Close() // release held requests, or Shutdown would wait for their clients
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		if err := s.Shutdown(sctx); err != nil {
			s.Close()
		}
	}
	wg.Wait()
	return serveErr
}

// adminEndpoint returns the Injector's admin endpoint, taking YAML bodies
// too, or a usage error naming every bad --admin-host.
func (f *faultFlags) adminEndpoint(in *fault.Injector) (http.Handler, error) {
	h, err := in.Admin(fault.AdminConfig{AllowRemote: f.allowRemote, Hosts: f.adminHosts})
	if err != nil {
		var bad []string
		for _, host := range f.adminHosts {
			if _, err := in.Admin(fault.AdminConfig{Hosts: []string{host}}); err != nil {
				bad = append(bad, strconv.Quote(host))
			}
		}
		return nil, usageError{fmt.Sprintf("--admin-host %s: want a host name or host:port", strings.Join(bad, ", "))}
	}
	return yamlBodies(h), nil
}

// loopbackAddr reports whether a listen address is on loopback only.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
