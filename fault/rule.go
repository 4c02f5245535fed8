package fault

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"path"
	"sort"
	"strings"
)

// ErrInvalidConfig is the sentinel every configuration error Is: a bad rule, a bad
// config file, a bad X-Fault header.
var ErrInvalidConfig = errors.New("fault: invalid config")

// RuleError says which rule of a list is wrong, and which of its fields.
// It Is ErrInvalidConfig and unwraps to the cause. Like most errors it is not
// modified after it is returned, so it may be shared between goroutines.
type RuleError struct {
	// Index is the rule's position in its list, from 0; -1 when the rule
	// does not come from a list (an X-Fault header, a --fault flag).
	Index int
	// Name is the rule's name, when it has one.
	Name string
	// Field is the config name of the bad field ("status", "match.path");
	// empty when the rule as a whole is wrong.
	Field string
	// Err says what is wrong.
	Err error
}

// Error names the rule and the field: `fault: rule 2 (flaky): status: 99 is
// not an error status (want 400-599)`.
func (e *RuleError) Error() string {
	var b strings.Builder
	b.WriteString("fault: ")
	if e.Index >= 0 {
		fmt.Fprintf(&b, "rule %d", e.Index)
		if e.Name != "" {
			fmt.Fprintf(&b, " (%s)", e.Name)
		}
	} else {
		b.WriteString("rule")
		if e.Name != "" {
			fmt.Fprintf(&b, " %s", e.Name)
		}
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

// Is reports whether target is ErrInvalidConfig.
func (e *RuleError) Is(target error) bool { return target == ErrInvalidConfig }

// Unwrap returns the cause.
func (e *RuleError) Unwrap() error { return e.Err }

// Rule applies Fault to the requests it matches, with probability
// Probability. A Rule is a plain value; the Injector copies it.
type Rule struct {
	// Name identifies the rule in counters and errors: letters, digits, '-',
	// '_' and '.', at most 64 characters, unique in its list. Empty means
	// "rule-N" with N the rule's index.
	Name string
	// Match selects the requests. The zero Match matches every request.
	Match Match
	// Probability is the chance, from 0 to 1, that a matching request gets
	// the fault. Zero means 1: a rule always fires unless told otherwise
	// (switch a rule off with Disabled).
	Probability float64
	// Disabled keeps the rule in the list, and its counters, without
	// matching anything.
	Disabled bool
	// Fault is what happens to the request. Required.
	Fault Fault
}

// Match selects requests. Every condition set must hold; a zero field
// matches anything. The Injector keeps its own copy, so a Match may be
// reused or changed after New. Server side the request is the incoming one; client side
// it is the outgoing one, before any fault.
type Match struct {
	// Methods lists the methods matched (case-insensitive). Empty matches
	// every method.
	Methods []string
	// Host is a path.Match glob on the request's host (with its port, if the
	// request names one), compared case-insensitively: "api.internal:*".
	// Empty matches every host.
	Host string
	// Path is a path.Match glob on the URL path ('*' does not cross '/'),
	// with one addition: a final "/**" matches the path before it and
	// everything below it ("/api/**" matches /api, /api/ and /api/a/b).
	// Empty matches every path.
	Path string
	// Headers maps a header name to the value it must have (any of its
	// values may match). A value ending in '*' matches by prefix; "*" alone
	// only requires the header to be present. Empty matches any headers.
	Headers map[string]string
}

// call is what a rule matches a call on: an HTTP request, a gRPC call or
// a plain function call. It is built on the stack for every call, so that
// matching allocates nothing.
type call struct {
	method, host, path string
	// header holds the HTTP request's header (canonical keys); metadata
	// looks up a key (in lower case) of a gRPC call's metadata. At most one
	// is set.
	header   http.Header
	metadata func(key string) []string
}

// httpCall returns what r is matched on.
func httpCall(r *http.Request) call {
	c := call{method: r.Method, host: r.Host, header: r.Header}
	if r.URL != nil {
		if c.host == "" {
			c.host = r.URL.Host
		}
		c.path = r.URL.Path
	}
	return c
}

// matches reports whether c is selected. m must be valid; mdHeaders is
// m.Headers with lower-case keys, for gRPC metadata.
func (m *Match) matches(c *call, mdHeaders map[string]string) bool {
	if len(m.Methods) > 0 {
		found := false
		for _, meth := range m.Methods {
			if strings.EqualFold(meth, c.method) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	// The path before the host: a gRPC server looks the host up, at the
	// cost of a copy.
	if m.Path != "" {
		p := c.path
		if p == "" {
			p = "/"
		}
		if !matchPath(m.Path, p) {
			return false
		}
	}
	if m.Host != "" {
		host := c.host
		if host == "" && c.metadata != nil {
			if v := c.metadata(":authority"); len(v) > 0 {
				host = v[0]
			}
		}
		if ok, _ := path.Match(m.Host, strings.ToLower(host)); !ok {
			return false
		}
	}
	if len(m.Headers) == 0 {
		return true
	}
	if c.metadata != nil {
		for name, want := range mdHeaders {
			if !matchHeader(c.metadata(name), want) {
				return false
			}
		}
		return true
	}
	for name, want := range m.Headers {
		if !matchHeader(c.header.Values(name), want) {
			return false
		}
	}
	return true
}

func matchPath(pattern, p string) bool {
	if base, ok := strings.CutSuffix(pattern, "/**"); ok {
		// Compare base with as many leading segments of p as base has.
		k := strings.Count(base, "/")
		prefix := p
		for i, seen := 0, 0; i < len(p); i++ {
			if p[i] == '/' {
				if seen == k {
					prefix = p[:i]
					break
				}
				seen++
			}
		}
		ok, _ := path.Match(base, prefix)
		return ok
	}
	ok, _ := path.Match(pattern, p)
	return ok
}

func matchHeader(values []string, want string) bool {
	if len(values) == 0 {
		return false
	}
	if want == "*" {
		return true
	}
	prefix, isPrefix := strings.CutSuffix(want, "*")
	for _, v := range values {
		if isPrefix && strings.HasPrefix(v, prefix) || v == want {
			return true
		}
	}
	return false
}

// normalize validates r and returns it with defaults applied (a name, upper
// case methods, a lower case host, canonical header names) and deep copies of
// its slices and maps. index is the rule's position, -1 for none. An invalid
// rule returns one *RuleError per invalid field, joined.
func (r Rule) normalize(index int) (Rule, error) {
	var errs []error
	bad := func(field string, err error) {
		errs = append(errs, &RuleError{Index: index, Name: r.Name, Field: field, Err: err})
	}
	if r.Name == "" && index >= 0 {
		r.Name = fmt.Sprintf("rule-%d", index)
	}
	if r.Name != "" && !validName(r.Name) {
		bad("name", fmt.Errorf("%q: use at most 64 letters, digits, '-', '_' or '.'", r.Name))
	}
	if math.IsNaN(r.Probability) || r.Probability < 0 || r.Probability > 1 {
		bad("probability", fmt.Errorf("%v is not between 0 and 1", r.Probability))
	}
	if r.Fault == nil {
		bad("kind", errors.New("missing: say which fault the rule applies"))
	} else if field, err := r.Fault.validate(); err != nil {
		bad(field, err)
	}
	m, merrs := r.Match.normalize()
	for _, e := range merrs {
		bad(e.field, e.err)
	}
	if len(errs) > 0 {
		return Rule{}, errors.Join(errs...)
	}
	r.Match = m
	return r, nil
}

// fieldError is one invalid field of a Match, before it is put in a
// RuleError.
type fieldError struct {
	field string
	err   error
}

// normalize validates m and returns a deep copy with upper case methods, a
// lower case host and canonical header names, and an error per invalid
// field.
func (m Match) normalize() (Match, []fieldError) {
	var errs []fieldError
	bad := func(field string, err error) { errs = append(errs, fieldError{field, err}) }
	if len(m.Methods) > 0 {
		methods := make([]string, len(m.Methods))
		for i, meth := range m.Methods {
			if !validToken(meth) {
				bad("match.methods", fmt.Errorf("%q is not a method", meth))
			}
			methods[i] = strings.ToUpper(meth)
		}
		m.Methods = methods
	} else {
		m.Methods = nil
	}
	if m.Host != "" {
		m.Host = strings.ToLower(m.Host)
		if _, err := path.Match(m.Host, ""); err != nil {
			bad("match.host", fmt.Errorf("%q: %v", m.Host, err))
		}
	}
	if m.Path != "" {
		base := strings.TrimSuffix(m.Path, "/**")
		_, err := path.Match(base, "")
		switch {
		case !strings.HasPrefix(m.Path, "/"):
			bad("match.path", fmt.Errorf("%q does not start with '/'", m.Path))
		case strings.Contains(base, "**"):
			bad("match.path", fmt.Errorf("%q: \"**\" is allowed only as the last segment, after '/'", m.Path))
		case err != nil:
			bad("match.path", fmt.Errorf("%q: %v", m.Path, err))
		}
	}
	if len(m.Headers) > 0 {
		headers := make(map[string]string, len(m.Headers))
		names := make([]string, 0, len(m.Headers))
		for name := range m.Headers {
			names = append(names, name)
		}
		sort.Strings(names) // the same errors, in the same order, on every run
		for _, name := range names {
			v := m.Headers[name]
			switch {
			case !validToken(name):
				bad("match.headers", fmt.Errorf("%q is not a header name", name))
			case v == "":
				bad("match.headers", fmt.Errorf("%s: empty value; use \"*\" to match any value", name))
			case !validHeaderValue(v):
				bad("match.headers", fmt.Errorf("%s: %q is not a valid header value", name, v))
			}
			headers[http.CanonicalHeaderKey(name)] = v
		}
		m.Headers = headers
	} else {
		m.Headers = nil
	}
	return m, errs
}

// normalizeRules validates a list: each rule, and that names are unique.
// It reports every invalid rule, each with every invalid field.
func normalizeRules(rules []Rule) ([]Rule, error) {
	out := make([]Rule, len(rules))
	seen := make(map[string]int, len(rules))
	var errs []error
	for i, r := range rules {
		n, err := r.normalize(i)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if j, dup := seen[n.Name]; dup {
			errs = append(errs, &RuleError{Index: i, Name: n.Name, Field: "name",
				Err: fmt.Errorf("%q is already the name of rule %d", n.Name, j)})
			continue
		}
		seen[n.Name] = i
		out[i] = n
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

func validName(s string) bool {
	if len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// validToken reports whether s is an RFC 9110 token (methods, header names).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
