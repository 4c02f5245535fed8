package config

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/extra/ratelimit"
	"github.com/guardrail-go/guardrail/fleet"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/shed"
	"github.com/guardrail-go/guardrail/throttle"
)

// Kinds of dependency.
const (
	kindHTTP   = "http"
	kindGRPC   = "grpc"
	kindPolicy = "policy"
)

// checkedFile is a parsed file with every dependency's effective settings
// resolved: what parse returns, what Parse reports (and guardrail check
// prints) and what a Registry is built from. It is immutable once
// returned.
type checkedFile struct {
	// Name is the file's name as given to Parse.
	Name string
	// File is the file as written.
	File *policyFile
	// Dependencies are the resolved dependencies, sorted by name.
	Dependencies []*resolvedDep
	// Servers are the resolved servers, sorted by name.
	Servers []*resolvedServer
	// Errors and Warnings are the findings, in line order.
	Errors, Warnings []Diagnostic

	lines  map[string]int
	byName map[string]*resolvedDep // built after resolve, by dependency
}

// resolvedDep is one dependency's settings: the defaults overridden
// by what the dependency sets, and the guardrail values they configure.
// It is a plain value, safe to read concurrently.
type resolvedDep struct {
	Name string
	Kind string
	fileReview
	Calls []string
	// Settings are the defaults merged with the dependency's own; a nil
	// field is the library's default.
	Settings fileSettings
	// Overrides are the dotted keys the dependency sets itself.
	Overrides []string

	// HTTP is the guardhttp.Config an HTTP dependency's client is built
	// with, without its Budget, Breakers, Throttler and Observer, which
	// the Registry supplies (and keeps across reloads).
	HTTP guardhttp.Config
	// GRPC is the settings a gRPC dependency's client is built with,
	// without its Budget, Breakers, Bulkheads, Throttler and Observer,
	// which the Registry supplies (and keeps across reloads).
	GRPC GRPCSettings
	// Group configures the breakers of an HTTP dependency, one per host,
	// or of a gRPC one, one per target or method.
	Group breaker.GroupConfig
	// Breaker configures a policy dependency's breaker.
	Breaker breaker.Config
	// Budget configures the retry budget; nil means budget.Unlimited.
	Budget *budget.Config
	// Bulkhead configures a policy dependency's bulkhead, or each
	// compartment of a gRPC or HTTP one (also in HTTP.Bulkhead and
	// GRPC.Bulkhead); nil means none.
	Bulkhead *bulkhead.Config
	// Retry is the dependency's retry settings (also in HTTP.Retry and
	// GRPC.Retry), without the Budget the Registry supplies.
	Retry guardrail.Retry
	// Idempotent is a policy dependency's guardrail.Policy.Idempotent.
	Idempotent bool
	// Deadline bounds a whole call; zero means no bound of its own.
	Deadline time.Duration
	// Hedge configures hedging (also in HTTP.Hedge and GRPC.Hedge); nil
	// means none.
	Hedge *guardrail.HedgeConfig
	// Throttle configures the dependency's Throttler (also in
	// GRPC.Throttle), which the Registry builds once and shares between
	// everything that calls the dependency; nil means none.
	Throttle *throttle.Config
}

// resolvedServer is one server's settings.
// It is a plain value, safe to read concurrently.
type resolvedServer struct {
	Name string
	fileReview
	Calls []string
	// Deadline, Shed, Idempotency and RateLimit are nil when the file has
	// no such section for the server. RateLimit has no Key: the code
	// passes it to Registry.RateLimiter.
	Deadline    *deadline.Config
	Shed        *shed.Config
	Idempotency *idempotency.Config
	RateLimit   *ratelimit.Config
	// RateLimitShared is the fleet limiter of a rate_limit section with
	// shared, without its Store (Options.TokenStore); nil without one.
	RateLimitShared *fleet.LimiterConfig
	// IdempotencyScopeCaller is true when the scope is the caller's, which
	// the code supplies.
	IdempotencyScopeCaller bool
}

// Parse reads a policy file and checks it as Load and Reload do, without
// building anything, and reports it as guardrail check prints it: every
// dependency's effective settings, what differs from the defaults and
// why, and the file's errors and warnings. name is used in diagnostics
// (the file's path, or "policy.yaml"). The error is an *Error that Is
// ErrInvalidConfig when the file holds an error; warnings do not make an
// error. The Report is returned in either case.
func Parse(name string, data []byte) (*Report, error) {
	c, err := parse(name, data)
	rep := c.report()
	return &rep, err
}

// parse reads a policy file, checks it and resolves its settings. The
// checkedFile is returned in either case, for its diagnostics.
func parse(name string, data []byte) (*checkedFile, error) {
	f, lines, diags := parseFile(name, data)
	c := &checkedFile{Name: name, File: f, lines: lines}
	// A key that did not decode stays unset; the rest is still checked, so
	// that one run reports every error.
	diags = append(diags, c.resolve()...)
	c.Errors, c.Warnings = split(diags)
	if len(c.Errors) > 0 {
		return c, &Error{Diagnostics: c.Errors}
	}
	return c, nil
}

// line returns the line of path, or of its closest written ancestor.
func (c *checkedFile) line(path string) int {
	for path != "" {
		if l, ok := c.lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 1
}

func (c *checkedFile) diag(sev string, path, format string, args ...any) Diagnostic {
	return Diagnostic{File: c.Name, Line: c.line(path), Field: path, Severity: sev, Message: fmt.Sprintf(format, args...)}
}

// where returns the path at which key (dotted, within Settings) of
// dependency dep was written: the dependency's own, or the defaults'.
func (c *checkedFile) where(dep, key string) string {
	own := "dependencies." + dep + "." + key
	if _, ok := c.lines[own]; ok {
		return own
	}
	def := "defaults." + key
	if _, ok := c.lines[def]; ok {
		return def
	}
	return own
}

// merge returns def overridden by over, field by field, nested sections
// included; it appends the dotted keys over sets to set.
func merge(def, over reflect.Value, prefix string, set *[]string) {
	t := def.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		key := join(prefix, f.Tag.Get("yaml"))
		dv, ov := def.Field(i), over.Field(i)
		if ov.IsNil() {
			continue
		}
		if f.Type.Elem().Kind() == reflect.Struct && !dv.IsNil() {
			merged := reflect.New(f.Type.Elem())
			merged.Elem().Set(dv.Elem())
			merge(merged.Elem(), ov.Elem(), key, set)
			dv.Set(merged)
			continue
		}
		if f.Type.Elem().Kind() == reflect.Struct {
			collect(ov.Elem(), key, set)
		} else {
			*set = append(*set, key)
		}
		dv.Set(ov)
	}
}

// collect appends the keys a section sets, or the section's own key when
// it sets none: an empty section (hedge: {}) turns a guardrail on with its
// defaults, which is an override as much as any key in it.
func collect(v reflect.Value, prefix string, set *[]string) {
	t := v.Type()
	n := len(*set)
	for i := range t.NumField() {
		if !v.Field(i).IsNil() {
			*set = append(*set, join(prefix, t.Field(i).Tag.Get("yaml")))
		}
	}
	if len(*set) == n {
		*set = append(*set, prefix)
	}
}

func val[T any](p *T) T {
	if p == nil {
		var z T
		return z
	}
	return *p
}

// onlyFor lists the keys that apply to some kinds only, with the kinds.
// The defaults may set them: a dependency of another kind ignores them.
var onlyFor = map[string][]string{
	"connect_timeout":         {kindHTTP},
	"tls_handshake_timeout":   {kindHTTP},
	"write_timeout":           {kindHTTP},
	"response_header_timeout": {kindHTTP},
	"body_idle_timeout":       {kindHTTP},
	"max_buffered_body":       {kindHTTP},
	"idempotency_keys":        {kindHTTP},
	"deadline_reserve":        {kindHTTP},
	"breaker.max_keys":        {kindHTTP, kindGRPC},
	"breaker.idle_ttl":        {kindHTTP, kindGRPC},
	"idempotent_methods":      {kindGRPC},
	"max_buffered_messages":   {kindGRPC},
	"failure_domain":          {kindGRPC},
	"idempotent":              {kindPolicy},
}

// elsewhere says, for a key that does not apply to a kind, what does.
var elsewhere = map[[2]string]string{
	{kindGRPC, "idempotent"}:            "; list the methods that are safe to repeat in idempotent_methods",
	{kindGRPC, "idempotency_keys"}:      "; a gRPC call whose outgoing metadata carries an idempotency-key is retried as idempotent, so the code sets it",
	{kindGRPC, "max_buffered_body"}:     "; a stream's messages kept for a retry are max_buffered_messages",
	{kindPolicy, "idempotent_methods"}:  "; a policy is idempotent or not as a whole: idempotent",
	{kindHTTP, "idempotent_methods"}:    "; an HTTP request's idempotence is its method's, or a key's (idempotency_keys)",
	{kindHTTP, "idempotent"}:            "; an HTTP request's idempotence is its method's, or a key's (idempotency_keys)",
	{kindHTTP, "max_buffered_messages"}: "; an HTTP request body kept for a retry is max_buffered_body",
}

func (c *checkedFile) resolve() []Diagnostic {
	var diags []Diagnostic
	f := c.File
	if f.Version != nil && *f.Version != 1 {
		diags = append(diags, c.diag(severityError, "version", "is %d; want 1, the only version of the format", *f.Version))
	}
	def := fileSettings{}
	if f.Defaults != nil {
		def = *f.Defaults
	}
	names := make([]string, 0, len(f.Dependencies))
	for n := range f.Dependencies {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		d := f.Dependencies[name]
		r := &resolvedDep{Name: name, Kind: kindHTTP, fileReview: d.fileReview, Calls: d.Calls}
		path := "dependencies." + name
		if d.Kind != nil {
			switch *d.Kind {
			case kindHTTP, kindGRPC, kindPolicy:
				r.Kind = *d.Kind
			default:
				diags = append(diags, c.diag(severityError, path+".kind", "is %q; want http, grpc or policy", *d.Kind))
			}
		}
		r.Settings = def
		merge(reflect.ValueOf(&r.Settings).Elem(), reflect.ValueOf(&d.fileSettings).Elem(), "", &r.Overrides)
		if len(r.Overrides) > 0 && (d.Reason == nil || strings.TrimSpace(*d.Reason) == "") {
			diags = append(diags, c.diag(severityError, path+".reason", "is missing; %s overrides %s, and every override must say why (reason: ...), so that its review has the reason beside it",
				name, strings.Join(r.Overrides, ", ")))
		}
		for _, k := range r.Overrides {
			if kinds, ok := onlyFor[k]; ok && !contains(kinds, r.Kind) {
				diags = append(diags, c.diag(severityError, path+"."+k, "applies to %s dependencies only; this one is kind %s%s", strings.Join(kinds, " and "), r.Kind, elsewhere[[2]string{r.Kind, k}]))
			}
		}
		for i, rt := range d.Routes {
			at := fmt.Sprintf("%s.routes[%d]", path, i)
			switch {
			case r.Kind == kindGRPC && (rt == nil || rt.Method == nil):
				diags = append(diags, c.diag(severityError, at, "needs method, the full method name, such as {method: /pkg.Service/Method}"))
			case r.Kind == kindGRPC && rt.Path != nil:
				diags = append(diags, c.diag(severityError, at+".path", "applies to http dependencies only; a gRPC route is its full method name, in method"))
			case r.Kind == kindGRPC && !methodName(*rt.Method, false):
				diags = append(diags, c.diag(severityError, at+".method", "is %q; want a full method name such as /pkg.Service/Method", *rt.Method))
			case r.Kind != kindGRPC && (rt == nil || rt.Method == nil || rt.Path == nil):
				diags = append(diags, c.diag(severityError, at, "needs method and path, such as {method: POST, path: /charges}"))
			}
		}
		diags = append(diags, c.build(r)...)
		c.Dependencies = append(c.Dependencies, r)
	}
	c.byName = make(map[string]*resolvedDep, len(c.Dependencies))
	for _, d := range c.Dependencies {
		c.byName[d.Name] = d
	}
	snames := make([]string, 0, len(f.Servers))
	for n := range f.Servers {
		snames = append(snames, n)
	}
	sort.Strings(snames)
	for _, name := range snames {
		s := f.Servers[name]
		r := &resolvedServer{Name: name, fileReview: s.fileReview, Calls: s.Calls}
		diags = append(diags, c.buildServer(r, s)...)
		c.Servers = append(c.Servers, r)
	}
	diags = append(diags, c.checkCalls()...)
	diags = append(diags, c.warnings()...)
	return diags
}

func contains(s []string, v string) bool {
	for _, e := range s {
		if e == v {
			return true
		}
	}
	return false
}

// coreRE takes apart the errors of the core constructors:
// "breaker: GroupConfig.Config.FailureRate is 1.5; want ...".
var coreRE = regexp.MustCompile(`^(\w+): (?:invalid \w+: )?(?:\w+\.)*?(\w*Config)\.([A-Z][\w.]*)(?:\[[^\]]*\])? (?:is|has) (.*)$`)

// coreErrors turns a constructor's error into diagnostics on the keys of
// section (a schema type such as fileBreaker) under prefix, of dependency dep
// ("" for a server, whose keys are under prefix alone).
func (c *checkedFile) coreErrors(err error, section reflect.Type, dep, prefix string) []Diagnostic {
	if err == nil {
		return nil
	}
	var out []Diagnostic
	for _, msg := range strings.Split(err.Error(), "\n") {
		path := prefix
		if m := coreRE.FindStringSubmatch(msg); m != nil {
			// "GroupConfig.Config.FailureRate" is the breaker's field,
			// "GroupConfig.MaxKeys" the group's.
			typ, field := m[2], m[3]
			if f, ok := strings.CutPrefix(field, "Config."); ok {
				typ, field = "Config", f
			}
			if key, ok := keyOf(section, field); ok {
				path = join(prefix, key)
				if dep != "" {
					path = c.where(dep, path)
				}
				msg = "is " + m[4] + " (" + m[1] + ": " + typ + "." + field + ")"
			}
		}
		if dep != "" && path == prefix {
			path = "dependencies." + dep + "." + prefix
			path = strings.TrimSuffix(path, ".")
		}
		out = append(out, c.diag(severityError, path, "%s", msg))
	}
	return out
}

// keyOf maps a Go field path of a core Config ("Adaptive.InitialLimit") to
// the file's key ("adaptive.initial_limit") through section's fields of the
// same names.
func keyOf(section reflect.Type, goPath string) (string, bool) {
	var keys []string
	t := section
	for _, name := range strings.Split(goPath, ".") {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return "", false
		}
		f, ok := t.FieldByName(name)
		if !ok || f.Tag.Get("yaml") == "" || strings.HasPrefix(f.Tag.Get("yaml"), ",") {
			return "", false
		}
		keys = append(keys, f.Tag.Get("yaml"))
		t = f.Type
	}
	return strings.Join(keys, "."), true
}

// build fills r's guardrail configurations and validates them with the
// constructors that will use them.
func (c *checkedFile) build(r *resolvedDep) []Diagnostic {
	var diags []Diagnostic
	s := &r.Settings
	name := r.Name
	strategy, ok := backoffStrategy(s.Backoff)
	if !ok {
		diags = append(diags, c.diag(severityError, c.where(name, "backoff.strategy"), "is %q; want full_jitter, equal_jitter, exponential, decorrelated, constant or none", val(s.Backoff.Strategy)))
	}
	for _, k := range []string{"base", "cap"} {
		if s.Backoff == nil {
			break
		}
		p := s.Backoff.Base
		if k == "cap" {
			p = s.Backoff.Cap
		}
		if p != nil && *p < 0 {
			diags = append(diags, c.diag(severityError, c.where(name, "backoff."+k), "is %v; want a positive duration, or leave it out for the default", *p))
		}
	}
	if v := val(s.Deadline); v < 0 {
		diags = append(diags, c.diag(severityError, c.where(name, "deadline"), "is %v; want a positive duration, or leave it out for none", v))
	}
	r.Deadline = max(val(s.Deadline), 0)
	r.Retry = retryOf(s, strategy)

	// Retry budget.
	if rb := s.RetryBudget; rb != nil && val(rb.Unlimited) {
		diags = append(diags, c.beside(name, "retry_budget", "unlimited", "a budget", "ratio", "max", "min_per_second")...)
	}
	if r.Budget = budgetConfig(s.RetryBudget); r.Budget != nil {
		_, err := budget.New(*r.Budget)
		diags = append(diags, c.coreErrors(err, reflect.TypeFor[fileRetryBudget](), name, "retry_budget")...)
	}

	// Breaker.
	bc, ok := breakerConfig(name, s.Breaker)
	if !ok {
		diags = append(diags, c.diag(severityError, c.where(name, "breaker.mode"), "is %q; want normal, metrics_only or disabled", val(s.Breaker.Mode)))
	}

	// Bulkhead.
	if r.Bulkhead = bulkheadConfig(s.Bulkhead); r.Bulkhead != nil {
		_, err := bulkhead.New(*r.Bulkhead)
		diags = append(diags, c.coreErrors(err, reflect.TypeFor[fileBulkhead](), name, "bulkhead")...)
	}

	diags = append(diags, c.buildHedge(r)...)

	if r.Kind == kindPolicy {
		r.Breaker = bc
		r.Idempotent = val(s.Idempotent)
		// A group checks the Config as New does, without allocating the
		// breaker's window (a count window may hold a million calls).
		_, err := breaker.NewGroup(breaker.GroupConfig{Config: bc})
		diags = append(diags, c.coreErrors(err, reflect.TypeFor[fileBreaker](), name, "breaker")...)
		return append(diags, c.checkPolicy(name, r.Retry)...)
	}

	r.Group = breakerGroupConfig(s.Breaker, bc)
	_, err := breaker.NewGroup(r.Group)
	diags = append(diags, c.coreErrors(err, reflect.TypeFor[fileBreaker](), name, "breaker")...)
	if r.Kind == kindGRPC {
		return append(diags, c.buildGRPC(r)...)
	}
	r.HTTP = httpConfig(r)
	plain := r.HTTP
	plain.Bulkhead, plain.Hedge = nil, nil // their errors are reported above, by key
	_, err = guardhttp.NewTransport(http.DefaultTransport, plain)
	return append(diags, c.coreErrors(err, reflect.TypeFor[fileSettings](), name, "")...)
}

// beside reports a section of dependency name that says flag (unlimited,
// disabled) with settings beside it: flag overrides a section inherited
// from the defaults, but one section saying both is a contradiction.
func (c *checkedFile) beside(name, section, flag, want string, keys ...string) []Diagnostic {
	var diags []Diagnostic
	at := c.where(name, section+"."+flag)
	for _, k := range keys {
		if w := c.where(name, section+"."+k); strings.HasPrefix(w, strings.TrimSuffix(at, flag)) && c.lines[w] != 0 {
			diags = append(diags, c.diag(severityError, at, "is true with %s set beside it; want either %s or %s", k, flag, want))
		}
	}
	return diags
}

// Bounds of the hedge counts the file accepts, which the core does not
// bound: 1<<20 latencies, as many calls as a breaker's count window holds,
// are 16 MiB (the ring and the copy it is sorted in); 16 hedges per
// attempt are eight times the most that the checks let pass without a
// warning.
const (
	maxHedgeWindow = 1 << 20
	maxHedges      = 16
)

// buildHedge fills r.Hedge and r.Throttle and reports what the core
// refuses of them, on the keys that set each field.
func (c *checkedFile) buildHedge(r *resolvedDep) []Diagnostic {
	var diags []Diagnostic
	s := &r.Settings
	if h := s.Hedge; h != nil && val(h.Disabled) {
		diags = append(diags, c.beside(r.Name, "hedge", "disabled", "hedge settings", "delay", "percentile", "max_hedges", "window", "overload_pause")...)
	}
	if r.Hedge = hedgeConfig(s.Hedge); r.Hedge != nil {
		// The core takes any count, and sizes memory by it: the
		// window's latencies at first use (and in Validate, which
		// builds what it checks), room for every hedge at the start
		// of each hedged call. A slip of the keyboard must not take
		// the service down at its next reload, nor this check.
		check := *r.Hedge
		if n := check.Window; n > maxHedgeWindow {
			diags = append(diags, c.diag(severityError, c.where(r.Name, "hedge.window"), "is %d; want at most %d: the window keeps that many latencies in memory (16 bytes each), allocated at the first call", n, maxHedgeWindow))
			check.Window = 0
		}
		if n := check.MaxHedges; n > maxHedges {
			diags = append(diags, c.diag(severityError, c.where(r.Name, "hedge.max_hedges"), "is %d; want at most %d: each hedge is one more request in flight per call, and every hedged call makes room for all of them when it starts", n, maxHedges))
		}
		diags = append(diags, c.coreErrors(check.Validate(), reflect.TypeFor[fileHedge](), r.Name, "hedge")...)
	}
	if t := s.Throttle; t != nil && val(t.Disabled) {
		diags = append(diags, c.beside(r.Name, "throttle", "disabled", "throttle settings", "window", "k")...)
	}
	if r.Throttle = throttleConfig(s.Throttle); r.Throttle != nil {
		_, err := throttle.New(*r.Throttle)
		diags = append(diags, c.coreErrors(err, reflect.TypeFor[fileThrottle](), r.Name, "throttle")...)
	}
	return diags
}

// checkPolicy reports the invalid fields of the retry settings rt of
// dependency name. A Policy reports them at first use; one call of a
// throwaway one, with nothing shared, hears them now.
func (c *checkedFile) checkPolicy(name string, rt guardrail.Retry) []Diagnostic {
	rt.Budget = budget.Unlimited()
	p := &guardrail.Policy{Name: name, Retry: rt, Breaker: disabledBreaker()}
	_, err := guardrail.Do(context.Background(), p, func(context.Context) (struct{}, error) { return struct{}{}, nil })
	return c.policyErrors(err, name)
}

var policyRE = regexp.MustCompile(`Policy\.(\w+) is (.*)$`)

func (c *checkedFile) policyErrors(err error, dep string) []Diagnostic {
	if err == nil {
		return nil
	}
	var out []Diagnostic
	for _, msg := range strings.Split(err.Error(), "\n") {
		path := "dependencies." + dep
		if m := policyRE.FindStringSubmatch(msg); m != nil {
			if key, ok := keyOf(reflect.TypeFor[fileSettings](), m[1]); ok {
				path = c.where(dep, key)
				msg = "is " + m[2] + " (guardrail: Policy." + m[1] + ")"
			}
		}
		out = append(out, c.diag(severityError, path, "%s", msg))
	}
	return out
}

func disabledBreaker() *breaker.Breaker {
	b, _ := breaker.New(breaker.Config{Mode: breaker.Disabled}) // a valid Config
	return b
}

// nopStore stands in for the store while a server's idempotency settings
// are validated: New only checks that there is one.
type nopStore struct{ idempotency.Store }

func (c *checkedFile) buildServer(r *resolvedServer, s *fileServer) []Diagnostic {
	var diags []Diagnostic
	path := "servers." + r.Name
	if r.Deadline = deadlineConfig(s.Deadline); r.Deadline != nil {
		_, err := deadline.New(*r.Deadline)
		diags = append(diags, c.coreErrors(err, reflect.TypeFor[fileDeadline](), "", path+".deadline")...)
	}
	if sh := s.Shed; sh != nil {
		cfg, bad := shedConfig(r.Name, sh)
		for _, k := range bad {
			if k == "max_header_priority" {
				diags = append(diags, c.diag(severityError, path+".shed.max_header_priority", "is %q; want sheddable, low, normal, high or critical", *sh.MaxHeaderPriority))
			} else {
				diags = append(diags, c.diag(severityError, path+".shed."+k, "is not a priority; want sheddable, low, normal, high or critical"))
			}
		}
		r.Shed = &cfg
		_, err := shed.New(cfg)
		diags = append(diags, c.coreErrors(err, reflect.TypeFor[fileShed](), "", path+".shed")...)
	}
	if r.RateLimit = rateLimitConfig(r.Name, s.RateLimit); r.RateLimit != nil {
		shared, ok := sharedLimitConfig(s.RateLimit)
		r.RateLimitShared = shared
		if !ok {
			diags = append(diags, c.diag(severityError, path+".rate_limit.shared.on_store_failure", "is %q; want open or closed", *s.RateLimit.Shared.OnStoreFailure))
		}
		check := *r.RateLimit
		if shared != nil {
			// The fleet limiter takes rate, burst and max_keys; it is
			// checked without a store, which only Options can give.
			lc := *shared
			lc.Store = nopTokenStore{}
			lim, err := fleet.NewLimiter(lc)
			if err == nil {
				_ = lim.Close()
			} else {
				diags = append(diags, c.sharedLimitErrors(err, path+".rate_limit")...)
			}
			check.Rate, check.Burst, check.MaxKeys = 0, 0, 0
		}
		_, err := ratelimit.New(check)
		diags = append(diags, c.coreErrors(err, reflect.TypeFor[fileRateLimit](), "", path+".rate_limit")...)
	}
	if id := s.Idempotency; id != nil {
		cfg := idempotencyConfig(r.Name, id)
		check := cfg
		switch val(id.Scope) {
		case scopeSingleTenant:
		case scopeCaller:
			r.IdempotencyScopeCaller = true
			check.Scope = func(*http.Request) (string, error) { return "", nil }
		default:
			diags = append(diags, c.diag(severityError, path+".idempotency.scope", "is %q; want caller (keys scoped by the authenticated caller, whose Scope function the code passes) or single_tenant (one scope for every caller, when all are trusted alike)", val(id.Scope)))
		}
		r.Idempotency = &cfg
		if id.Scope != nil {
			_, err := idempotency.New(nopStore{}, check)
			diags = append(diags, c.coreErrors(err, reflect.TypeFor[fileIdempotency](), "", path+".idempotency")...)
		}
	}
	return diags
}

// nopTokenStore is the store a shared rate limit is checked with: it is
// never called, since the limiter is closed unused.
type nopTokenStore struct{}

func (nopTokenStore) Take(context.Context, string, int, float64, int) (int, time.Duration, error) {
	return 0, 0, nil
}

func (nopTokenStore) Return(context.Context, string, int, float64, int) error { return nil }

// sharedLimitErrors turns fleet.NewLimiter's error into diagnostics on the
// keys of a rate_limit section under prefix: rate, burst and max_keys,
// or those of its shared section.
func (c *checkedFile) sharedLimitErrors(err error, prefix string) []Diagnostic {
	var out []Diagnostic
	for _, line := range strings.Split(err.Error(), "\n") {
		e := errors.New(line)
		if m := coreRE.FindStringSubmatch(line); m != nil {
			if _, ok := keyOf(reflect.TypeFor[fileSharedLimit](), m[3]); ok {
				out = append(out, c.coreErrors(e, reflect.TypeFor[fileSharedLimit](), "", prefix+".shared")...)
				continue
			}
		}
		out = append(out, c.coreErrors(e, reflect.TypeFor[fileRateLimit](), "", prefix)...)
	}
	return out
}
