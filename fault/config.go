package fault

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxConfigSize is the largest config document ParseConfig accepts: 1 MiB.
const maxConfigSize = 1 << 20

// NewRand returns the random source a seed stands for in a config file or on
// a command line, for Config.Rand: uniform draws in [0, 1) from a PCG
// generator seeded with seed, so that the same seed replays the same faults
// everywhere. The function is safe for concurrent use (a mutex guards the
// generator); the sequence it returns is reproducible as long as the draws
// happen in the same order, which concurrent requests do not promise.
func NewRand(seed uint64) func() float64 {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var mu sync.Mutex
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}

// The file schema. Durations are strings in time.ParseDuration syntax,
// checked after decoding so that errors can name the field.
type fileSpec struct {
	Seed         *uint64           `json:"seed,omitempty"`
	HeaderFaults bool              `json:"header_faults,omitempty"`
	Header       string            `json:"header,omitempty"`
	Rules        []json.RawMessage `json:"rules"`
	// Counters is written by the admin endpoint and ignored on input, so
	// that its answer can be edited and sent back.
	Counters json.RawMessage `json:"counters,omitempty"`
}

type ruleSpec struct {
	Name        string     `json:"name,omitempty"`
	Disabled    bool       `json:"disabled,omitempty"`
	Probability *float64   `json:"probability,omitempty"`
	Match       *matchSpec `json:"match,omitempty"`
	Kind        faultKind  `json:"kind"`

	Delay *string `json:"delay,omitempty"`
	Min   *string `json:"min,omitempty"`
	Max   *string `json:"max,omitempty"`
	P50   *string `json:"p50,omitempty"`
	P99   *string `json:"p99,omitempty"`

	Status         *int    `json:"status,omitempty"`
	RetryAfter     *string `json:"retry_after,omitempty"`
	RetryAfterDate *bool   `json:"retry_after_date,omitempty"`
	RetryAfterRaw  *string `json:"retry_after_raw,omitempty"`
	Body           *string `json:"body,omitempty"`
	GRPCCode       *string `json:"grpc_code,omitempty"`

	Bytes *int    `json:"bytes,omitempty"`
	Every *string `json:"every,omitempty"`
}

type matchSpec struct {
	Methods []string          `json:"methods,omitempty"`
	Host    string            `json:"host,omitempty"`
	Path    string            `json:"path,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

var durationFields = map[string]bool{"delay": true, "min": true, "max": true, "p50": true,
	"p99": true, "retry_after": true, "every": true}

// params lists, per kind, the fault fields a rule of that kind may set.
var params = map[faultKind][]string{
	kindLatency:   {"delay", "min", "max", "p50", "p99"},
	kindError:     {"status", "retry_after", "retry_after_date", "retry_after_raw", "body", "grpc_code"},
	kindSlowBody:  {"bytes", "every"},
	kindStallBody: {"bytes"},
	kindTruncate:  {"bytes"},
}

// set returns the config names of the fault fields set in s.
func (s *ruleSpec) set() []string {
	var out []string
	add := func(name string, isSet bool) {
		if isSet {
			out = append(out, name)
		}
	}
	add("delay", s.Delay != nil)
	add("min", s.Min != nil)
	add("max", s.Max != nil)
	add("p50", s.P50 != nil)
	add("p99", s.P99 != nil)
	add("status", s.Status != nil)
	add("retry_after", s.RetryAfter != nil)
	add("retry_after_date", s.RetryAfterDate != nil)
	add("retry_after_raw", s.RetryAfterRaw != nil)
	add("body", s.Body != nil)
	add("grpc_code", s.GRPCCode != nil)
	add("bytes", s.Bytes != nil)
	add("every", s.Every != nil)
	return out
}

// rule converts s to a Rule; index is its position, -1 for none. The Rule
// still has to be normalized.
func (s *ruleSpec) rule(index int) (Rule, error) {
	fail := func(field string, err error) (Rule, error) {
		return Rule{}, &RuleError{Index: index, Name: s.Name, Field: field, Err: err}
	}
	r := Rule{Name: s.Name, Disabled: s.Disabled, Probability: 1}
	if s.Probability != nil {
		switch p := *s.Probability; {
		case p == 0:
			return fail("probability", errors.New("0 never fires: remove the rule or set disabled"))
		case !(p > 0 && p <= 1):
			return fail("probability", fmt.Errorf("%v is not between 0 and 1", p))
		}
		r.Probability = *s.Probability
	}
	if s.Match != nil {
		r.Match = Match{Methods: s.Match.Methods, Host: s.Match.Host, Path: s.Match.Path,
			Headers: s.Match.Headers}
	}
	allowed := params[s.Kind]
	for _, f := range s.set() {
		found := false
		for _, a := range allowed {
			found = found || a == f
		}
		if !found {
			return fail(f, fmt.Errorf("does not apply to kind %q", s.Kind))
		}
	}
	var firstErr error
	var errField string
	dur := func(field string, v *string) time.Duration {
		if v == nil || firstErr != nil {
			return 0
		}
		d, err := time.ParseDuration(*v)
		if err != nil {
			firstErr, errField = fmt.Errorf("%q is not a duration such as \"200ms\"", *v), field
		}
		return d
	}
	deref := func(p *int) int {
		if p == nil {
			return 0
		}
		return *p
	}
	switch s.Kind {
	case kindLatency:
		r.Fault = Latency{Delay: dur("delay", s.Delay), Min: dur("min", s.Min),
			Max: dur("max", s.Max), P50: dur("p50", s.P50), P99: dur("p99", s.P99)}
	case kindError:
		st := Status{Code: deref(s.Status), RetryAfter: dur("retry_after", s.RetryAfter)}
		if s.RetryAfterDate != nil {
			st.RetryAfterDate = *s.RetryAfterDate
		}
		if s.RetryAfterRaw != nil {
			st.RetryAfterRaw = *s.RetryAfterRaw
			if st.RetryAfterRaw == "" {
				return fail("retry_after_raw", errors.New("empty"))
			}
		}
		if s.Body != nil {
			st.Body = *s.Body
		}
		if s.GRPCCode != nil {
			// Names are written upper case in the spec; accept any case.
			st.GRPCCode = strings.ToUpper(*s.GRPCCode)
			if st.GRPCCode == "" {
				return fail("grpc_code", errors.New("empty"))
			}
		}
		if s.Status != nil && *s.Status == 0 {
			return fail("status", errors.New("0 is not an error status (want 400-599)"))
		}
		r.Fault = st
	case kindReset:
		r.Fault = Reset{}
	case kindHang:
		r.Fault = Hang{}
	case kindSlowBody:
		r.Fault = SlowBody{Bytes: deref(s.Bytes), Every: dur("every", s.Every)}
	case kindStallBody:
		r.Fault = StallBody{Bytes: deref(s.Bytes)}
	case kindTruncate:
		r.Fault = Truncate{Bytes: deref(s.Bytes)}
	case kindLoseResponse:
		r.Fault = LoseResponse{}
	case kindRefuse:
		r.Fault = Refuse{}
	case "":
		return fail("kind", fmt.Errorf("missing (want one of %s)", kindList()))
	default:
		return fail("kind", fmt.Errorf("%q is not a fault kind (want one of %s)", s.Kind, kindList()))
	}
	if firstErr != nil {
		return fail(errField, firstErr)
	}
	return r, nil
}

func kindList() string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// specOf converts a valid Rule back to its file form.
func specOf(r Rule) ruleSpec {
	s := ruleSpec{Name: r.Name, Disabled: r.Disabled, Kind: r.Fault.kind()}
	if r.Probability > 0 && r.Probability < 1 {
		p := r.Probability
		s.Probability = &p
	}
	m := r.Match
	if len(m.Methods) > 0 || m.Host != "" || m.Path != "" || len(m.Headers) > 0 {
		s.Match = &matchSpec{Methods: m.Methods, Host: m.Host, Path: m.Path, Headers: m.Headers}
	}
	dur := func(d time.Duration) *string {
		if d == 0 {
			return nil
		}
		v := d.String()
		return &v
	}
	num := func(n int) *int {
		if n == 0 {
			return nil
		}
		return &n
	}
	switch f := r.Fault.(type) {
	case Latency:
		s.Delay, s.Min, s.Max, s.P50, s.P99 = dur(f.Delay), dur(f.Min), dur(f.Max), dur(f.P50), dur(f.P99)
	case Status:
		s.Status = num(f.code())
		s.RetryAfter = dur(f.RetryAfter)
		if f.RetryAfterDate {
			s.RetryAfterDate = &f.RetryAfterDate
		}
		if f.RetryAfterRaw != "" {
			s.RetryAfterRaw = &f.RetryAfterRaw
		}
		if f.Body != "" {
			s.Body = &f.Body
		}
		if f.GRPCCode != "" {
			s.GRPCCode = &f.GRPCCode
		}
	case SlowBody:
		s.Bytes, s.Every = num(f.Bytes), dur(f.Every)
	case StallBody:
		s.Bytes = num(f.Bytes)
	case Truncate:
		s.Bytes = num(f.Bytes)
	}
	return s
}

// ParseConfig reads a config file, JSON or YAML (JSON when the document is
// valid JSON), both with the same schema:
//
//	seed: 42                # optional: replay the same faults (see NewRand)
//	header_faults: false    # optional: honour the X-Fault request header
//	header: X-Fault         # optional: the header's name
//	rules:
//	  - name: slow-orders   # optional, unique; default rule-N
//	    probability: 0.2    # optional, (0, 1]; default 1
//	    disabled: false     # optional
//	    match:              # optional; every condition set must hold
//	      methods: [GET, POST]
//	      host: "orders.internal:*"
//	      path: /orders/**
//	      headers: {X-Canary: "1"}
//	    kind: latency       # required; then the kind's own fields
//	    p50: 50ms
//	    p99: 2s
//
// The fields of each kind are: latency: delay, or min and max, or p50 and p99
// (with optional min and max); error: status, retry_after, retry_after_date,
// retry_after_raw, body, grpc_code (a gRPC code name such as
// RESOURCE_EXHAUSTED, for gRPC calls); slow_body: bytes, every; stall_body: bytes;
// truncate: bytes; reset, hang, lose_response and refuse take none. See the
// Fault types for their meaning. Durations are strings such as "200ms".
//
// A "counters" key (as written by the admin endpoint) is ignored. Unknown
// keys, fields that do not apply to the rule's kind and bad values are
// errors: a *RuleError naming the rule and the field, or for the document as
// a whole an error that Is ErrInvalidConfig. When the file has a seed, the returned
// Config's Rand is NewRand(seed); otherwise it is nil. An empty document is
// an empty Config; one larger than 1 MiB is an error that Is
// ErrInvalidConfig, read no further.
func ParseConfig(data []byte) (Config, error) {
	if len(data) > maxConfigSize {
		return Config{}, fmt.Errorf("%w: document larger than %d bytes", ErrInvalidConfig, maxConfigSize)
	}
	var cfg Config
	err := cfg.UnmarshalJSON(data)
	return cfg, err
}

// UnmarshalJSON reads c from the JSON config file format (see ParseConfig),
// replacing all of c.
func (c *Config) UnmarshalJSON(data []byte) error {
	*c = Config{}
	if len(bytes.TrimSpace(data)) == 0 || string(bytes.TrimSpace(data)) == "null" {
		return nil
	}
	var f fileSpec
	if err := strictJSON(data, &f); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, describe(err))
	}
	rules := make([]Rule, len(f.Rules))
	for i, raw := range f.Rules {
		var s ruleSpec
		if err := strictJSON(raw, &s); err != nil {
			var named struct{ Name string }
			_ = json.Unmarshal(raw, &named)
			re := &RuleError{Index: i, Name: named.Name, Err: err}
			var te *json.UnmarshalTypeError
			switch {
			case errors.As(err, &te):
				re.Field = te.Field
				want := jsonType(te.Type.String())
				if durationFields[te.Field] {
					want = `a duration such as "200ms"`
				}
				re.Err = fmt.Errorf("got a JSON %s, want %s", te.Value, want)
			case strings.HasPrefix(err.Error(), `json: unknown field "`):
				re.Field = strings.TrimSuffix(strings.TrimPrefix(err.Error(), `json: unknown field "`), `"`)
				re.Err = errors.New("unknown field")
			}
			return re
		}
		r, err := s.rule(i)
		if err != nil {
			return err
		}
		rules[i] = r
	}
	rules, err := normalizeRules(rules)
	if err != nil {
		return err
	}
	if f.Header != "" && !validToken(f.Header) {
		return fmt.Errorf("%w: header: %q is not a header name", ErrInvalidConfig, f.Header)
	}
	c.Rules, c.HeaderFaults, c.Header = rules, f.HeaderFaults, f.Header
	if f.Seed != nil {
		c.Rand = NewRand(*f.Seed)
	}
	return nil
}

// MarshalJSON writes c in the config file format (see ParseConfig), without
// a seed, or returns the *RuleError of an invalid rule.
func (c Config) MarshalJSON() ([]byte, error) {
	rules, err := normalizeRules(c.Rules)
	if err != nil {
		return nil, err
	}
	c.Rules = rules
	return json.Marshal(c.file(nil))
}

// fileOut is the file schema for output, with the rules decoded.
type fileOut struct {
	HeaderFaults bool       `json:"header_faults"`
	Header       string     `json:"header,omitempty"`
	Rules        []ruleSpec `json:"rules"`
	Counters     []Counter  `json:"counters,omitempty"`
}

func (c Config) file(counters []Counter) fileOut {
	f := fileOut{HeaderFaults: c.HeaderFaults, Header: c.Header, Rules: []ruleSpec{}, Counters: counters}
	for _, r := range c.Rules {
		f.Rules = append(f.Rules, specOf(r))
	}
	return f
}

func strictJSON(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("data after the document")
	}
	return nil
}

// describe rewrites encoding/json's errors about the top level in the
// config's terms.
func describe(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "document"
		}
		return fmt.Sprintf("%s: got a JSON %s, want %s", field, te.Value, jsonType(te.Type.String()))
	}
	if name, ok := strings.CutPrefix(err.Error(), `json: unknown field "`); ok {
		return strings.TrimSuffix(name, `"`) + ": unknown field"
	}
	return err.Error()
}

func jsonType(goType string) string {
	t := strings.TrimLeft(goType, "*")
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["), strings.HasPrefix(t, "fault."):
		return "an object"
	case t == "string" || t == "fault.faultKind":
		return "a string"
	case t == "bool":
		return "true or false"
	case t == "float64":
		return "a number"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "an integer"
	}
	return t
}

// ParseRule reads one rule written on one line, as given to the --fault flag
// of the commands and, without the match keys, in the X-Fault header:
//
//	kind; key=value; key=value ...
//
// The keys are the fault fields of ParseConfig's schema, plus name,
// probability and disabled, plus method (a comma-separated list), host, path
// and header (repeatable, "Name:value") for the match. For example:
//
//	error; status=503; retry_after=2s; probability=0.1; path=/api/**
//	latency; p50=20ms; p99=800ms; method=GET,HEAD
//
// Values cannot contain ';'. Errors are *RuleError values.
func ParseRule(spec string) (Rule, error) {
	r, err := parseLine(spec, true)
	if err != nil {
		return Rule{}, err
	}
	return r.normalize(-1)
}

func parseHeaderRule(v string) (Rule, error) {
	r, err := parseLine(v, false)
	if err != nil {
		return Rule{}, err
	}
	return r.normalize(-1)
}

func parseLine(spec string, allowMatch bool) (Rule, error) {
	parts := strings.Split(spec, ";")
	s := ruleSpec{Kind: faultKind(strings.TrimSpace(parts[0]))}
	for _, part := range parts[1:] {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		key, val, ok := strings.Cut(part, "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		var err error
		switch {
		case !ok:
			err = errors.New("want key=value")
		case matchKeys[key] && !allowMatch:
			err = errors.New("not allowed in a header fault")
		case matchKeys[key]:
			err = s.setMatch(key, val)
		default:
			err = s.setFault(key, val)
		}
		if err != nil {
			return Rule{}, &RuleError{Index: -1, Name: s.Name, Field: key, Err: err}
		}
	}
	return s.rule(-1)
}

// matchKeys are the keys of a one-line rule that say which requests it
// matches (and its name and state): not allowed in a header fault.
var matchKeys = map[string]bool{"name": true, "disabled": true, "method": true, "methods": true, "host": true, "path": true, "header": true}

// setMatch sets the field of s that one of matchKeys names.
func (s *ruleSpec) setMatch(key, val string) (err error) {
	if s.Match == nil {
		s.Match = &matchSpec{}
	}
	switch key {
	case "name":
		s.Name = val
	case "disabled":
		s.Disabled, err = parseBool(val)
	case "method", "methods":
		for m := range strings.SplitSeq(val, ",") {
			s.Match.Methods = append(s.Match.Methods, strings.TrimSpace(m))
		}
	case "host":
		s.Match.Host = val
	case "path":
		s.Match.Path = val
	case "header":
		name, v, ok := strings.Cut(val, ":")
		if !ok {
			return fmt.Errorf("%q: want Name:value", val)
		}
		if s.Match.Headers == nil {
			s.Match.Headers = map[string]string{}
		}
		s.Match.Headers[strings.TrimSpace(name)] = strings.TrimSpace(v)
	}
	return err
}

// setFault sets the field of s that key names among the probability and
// the fault's own fields.
func (s *ruleSpec) setFault(key, val string) (err error) {
	str := func(v string) *string { return &v }
	switch key {
	case "probability":
		p, perr := strconv.ParseFloat(val, 64)
		if perr != nil {
			err = fmt.Errorf("%q is not a number", val)
		}
		s.Probability = &p
	case "delay":
		s.Delay = str(val)
	case "min":
		s.Min = str(val)
	case "max":
		s.Max = str(val)
	case "p50":
		s.P50 = str(val)
	case "p99":
		s.P99 = str(val)
	case "status":
		s.Status, err = parseInt(val)
	case "retry_after":
		s.RetryAfter = str(val)
	case "retry_after_date":
		var b bool
		b, err = parseBool(val)
		s.RetryAfterDate = &b
	case "retry_after_raw":
		s.RetryAfterRaw = str(val)
	case "body":
		s.Body = str(val)
	case "grpc_code":
		s.GRPCCode = str(val)
	case "bytes":
		s.Bytes, err = parseInt(val)
	case "every":
		s.Every = str(val)
	default:
		return errors.New("unknown field")
	}
	return err
}

func parseInt(val string) (*int, error) {
	n, err := strconv.Atoi(val)
	if err != nil {
		return nil, fmt.Errorf("%q is not an integer", val)
	}
	return &n, nil
}

func parseBool(val string) (bool, error) {
	b, err := strconv.ParseBool(val)
	if err != nil {
		return false, fmt.Errorf("%q is not true or false", val)
	}
	return b, nil
}
