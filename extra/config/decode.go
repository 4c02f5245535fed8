package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// maxFileSize bounds the file Parse reads: a policy file is a page or two,
// and a bound keeps a wrong path (a log, a binary) from being read whole.
const maxFileSize = 1 << 20

// maxDepth bounds the nesting decode follows; the format nests five deep.
const maxDepth = 20

var durationType = reflect.TypeFor[time.Duration]()

// decoder turns a yaml.v3 node tree into a policyFile, strictly, recording the
// line of every key it reads so that later checks can name it.
type decoder struct {
	file  string
	lines map[string]int // dotted path -> line of its value
	diags []Diagnostic
}

func (d *decoder) errorf(line int, path, format string, args ...any) {
	d.diags = append(d.diags, Diagnostic{File: d.file, Line: line, Field: path, Severity: severityError, Message: fmt.Sprintf(format, args...)})
}

// parseFile decodes data into a policyFile. Syntax errors carry the line yaml.v3
// reports; every other error the line of the node at fault.
func parseFile(name string, data []byte) (*policyFile, map[string]int, []Diagnostic) {
	d := &decoder{file: name, lines: map[string]int{}}
	f := &policyFile{}
	if len(data) > maxFileSize {
		d.errorf(1, "", "the file is %d bytes; want at most %d", len(data), maxFileSize)
		return f, d.lines, d.diags
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			d.errorf(1, "", "the file is empty; want a mapping with at least one of version, defaults, dependencies, servers")
			return f, d.lines, d.diags
		}
		if l := tabIndent(data); l > 0 {
			d.errorf(l, "", "the line is indented with a tab; YAML indents with spaces")
		} else {
			d.errorf(syntaxLine(err), "", "%s", syntaxMessage(err))
		}
		return f, d.lines, d.diags
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		d.errorf(extra.Line, "", "a second YAML document; want one document per file")
	} else if !errors.Is(err, io.EOF) {
		d.errorf(syntaxLine(err), "", "%s", syntaxMessage(err))
	}
	node := &root
	if node.Kind == yaml.DocumentNode && len(node.Content) == 1 {
		node = node.Content[0]
	}
	d.decode(node, reflect.ValueOf(f).Elem(), "", 0)
	return f, d.lines, d.diags
}

// tabIndent returns the first line whose indentation holds a tab, or 0:
// yaml.v3 reports that error on the line before.
func tabIndent(data []byte) int {
	for i, l := range bytes.Split(data, []byte("\n")) {
		trimmed := bytes.TrimLeft(l, " \t")
		if len(trimmed) > 0 && bytes.IndexByte(l[:len(l)-len(trimmed)], '\t') >= 0 {
			return i + 1
		}
	}
	return 0
}

var lineRE = regexp.MustCompile(`line (\d+)`)

// syntaxLine finds the line in a yaml.v3 syntax error ("yaml: line 3:
// ..."). yaml.v3 counts the lines of its parser's errors ("did not find
// expected ...") from 0 and those of its scanner's from 1; the parser's are
// shifted to count from 1 too.
func syntaxLine(err error) int {
	if m := lineRE.FindStringSubmatch(err.Error()); m != nil {
		if n, e := strconv.Atoi(m[1]); e == nil {
			if strings.Contains(err.Error(), "did not find expected") {
				n++
			}
			return max(n, 1)
		}
	}
	return 1
}

func syntaxMessage(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	msg = lineRE.ReplaceAllString(msg, "")
	msg = strings.TrimLeft(msg, ": ")
	return "not valid YAML: " + msg
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// decode fills v from n. Only the kinds the schema types (file.go) use are handled.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string, depth int) {
	if depth > maxDepth {
		d.errorf(n.Line, path, "nested too deep")
		return
	}
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		d.errorf(n.Line, path, "anchors and aliases are not supported; write the settings out, or put shared ones in defaults")
		return
	}
	if _, ok := d.lines[path]; !ok {
		d.lines[path] = n.Line
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		d.errorf(n.Line, path, "is empty; write a value, or leave the key out for the default")
		return
	}
	t := v.Type()
	switch {
	case t.Kind() == reflect.Pointer:
		p := reflect.New(t.Elem())
		d.decode(n, p.Elem(), path, depth)
		v.Set(p)
	case t == durationType:
		d.duration(n, v, path)
	case t.Kind() == reflect.Struct:
		d.structure(n, v, path, depth)
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.errorf(n.Line, path, "is %s; want a mapping of names to settings", describe(n))
			return
		}
		m := reflect.MakeMap(t)
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Value == "" {
				d.errorf(k.Line, path, "has a key that is not a name; want names such as payments")
				continue
			}
			if seen[k.Value] {
				d.errorf(k.Line, join(path, k.Value), "appears twice; want each name once")
				continue
			}
			seen[k.Value] = true
			d.lines[join(path, k.Value)] = k.Line
			e := reflect.New(t.Elem()).Elem()
			d.decode(val, e, join(path, k.Value), depth+1)
			if e.Kind() == reflect.Pointer && e.IsNil() {
				continue // reported: an entry that did not decode is left out
			}
			m.SetMapIndex(reflect.ValueOf(k.Value), e)
		}
		v.Set(m)
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.errorf(n.Line, path, "is %s; want a list, such as [a, b]", describe(n))
			return
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, e := range n.Content {
			d.decode(e, s.Index(i), path+"["+strconv.Itoa(i)+"]", depth+1)
		}
		v.Set(s)
	default:
		d.scalar(n, v, path)
	}
}

// fieldsOf returns the keys of struct type t, inline structs' included,
// with the index path of each.
func fieldsOf(t reflect.Type) (keys []string, index map[string][]int) {
	index = map[string][]int{}
	var walk func(t reflect.Type, prefix []int)
	walk = func(t reflect.Type, prefix []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("yaml")
			idx := append(slices.Clone(prefix), i)
			if tag == ",inline" {
				walk(f.Type, idx)
				continue
			}
			if tag == "" {
				continue
			}
			keys = append(keys, tag)
			index[tag] = idx
		}
	}
	walk(t, nil)
	return keys, index
}

func (d *decoder) structure(n *yaml.Node, v reflect.Value, path string, depth int) {
	if n.Kind != yaml.MappingNode {
		d.errorf(n.Line, path, "is %s; want a mapping of settings", describe(n))
		return
	}
	keys, index := fieldsOf(v.Type())
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		name := k.Value
		idx, ok := index[name]
		switch {
		case k.Kind != yaml.ScalarNode:
			d.errorf(k.Line, path, "has a key that is not a name")
			continue
		case !ok:
			d.errorf(k.Line, join(path, name), "is not a known setting%s; want one of %s", suggest(name, keys), strings.Join(keys, ", "))
			continue
		case seen[name]:
			d.errorf(k.Line, join(path, name), "appears twice; want each setting once")
			continue
		}
		seen[name] = true
		d.lines[join(path, name)] = k.Line
		d.decode(val, v.FieldByIndex(idx), join(path, name), depth+1)
	}
}

// suggest offers the closest known key to a misspelt one.
func suggest(name string, keys []string) string {
	best, bestD := "", 3
	for _, k := range keys {
		if dd := distance(name, k); dd < bestD {
			best, bestD = k, dd
		}
	}
	if best == "" {
		return ""
	}
	return " (did you mean " + best + "?)"
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := 1
			if a[i-1] == b[j-1] {
				c = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+c)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "not a value"
}

var bareNumber = regexp.MustCompile(`^[+-]?[0-9]+(\.[0-9]+)?$`)

// subMinute are the duration keys whose sensible values are under a
// minute: the timeouts of one attempt or phase, backoff's base, a slow
// call, a wait, a hedge delay, a deadline. A bare number of 100 or more
// in one of them was most likely written in milliseconds (attempt_timeout:
// 700 is 700 ms, not 11 minutes), so the error suggests ms for it. Other
// keys (open_for, windows, TTLs, caps, pauses) sensibly run to minutes or
// hours, and so does any number below 100: the error suggests s for them.
var subMinute = map[string]bool{
	"attempt_timeout": true, "min_attempt_time": true, "deadline": true,
	"connect_timeout": true, "tls_handshake_timeout": true, "write_timeout": true,
	"response_header_timeout": true, "body_idle_timeout": true, "deadline_reserve": true,
	"base": true, "slow_call": true, "max_wait": true, "delay": true,
	"max": true, "reserve": true, // a server's deadline section
	"queue_interval": true, "max_queue_wait": true, "queue_target": true, "store_timeout": true,
}

// unitFor returns the unit the error for the bare number s at path
// suggests: "ms" for a number of 100 or more under a key of subMinute,
// else "s".
func unitFor(path, s string) string {
	key := path[strings.LastIndexByte(path, '.')+1:]
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= 100 && subMinute[key] {
		return "ms"
	}
	return "s"
}

func (d *decoder) duration(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode {
		d.errorf(n.Line, path, "is %s; want a duration such as 500ms or 2s", describe(n))
		return
	}
	s := strings.TrimSpace(n.Value)
	if bareNumber.MatchString(s) && s != "0" {
		d.errorf(n.Line, path, "%q has no unit; write %s%s", n.Value, s, unitFor(path, s))
		return
	}
	dur, err := time.ParseDuration(s)
	if err != nil {
		d.errorf(n.Line, path, "%q is not a duration; write a number and a unit (ns, us, ms, s, m, h), such as 500ms or 2s", n.Value)
		return
	}
	v.SetInt(int64(dur))
}

func (d *decoder) scalar(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode {
		d.errorf(n.Line, path, "is %s; want a single value", describe(n))
		return
	}
	s := n.Value
	switch v.Kind() {
	case reflect.String:
		if n.Tag != "!!str" {
			d.errorf(n.Line, path, "is %s, %s; want text (quote it)", n.Value, tagName(n.Tag))
			return
		}
		v.SetString(s)
	case reflect.Bool:
		if n.Tag != "!!bool" {
			d.errorf(n.Line, path, "is %q; want true or false", s)
			return
		}
		v.SetBool(s == "true" || s == "True" || s == "TRUE")
	case reflect.Int, reflect.Int64:
		i, err := strconv.ParseInt(s, 0, 64)
		if n.Tag != "!!int" || err != nil || (v.Kind() == reflect.Int && (i > math.MaxInt32 || i < math.MinInt32)) {
			d.errorf(n.Line, path, "is %q; want a whole number", s)
			return
		}
		v.SetInt(i)
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if (n.Tag != "!!float" && n.Tag != "!!int") || err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			d.errorf(n.Line, path, "is %q; want a number such as 0.5", s)
			return
		}
		v.SetFloat(f)
	default:
		d.errorf(n.Line, path, "cannot be read")
	}
}

func tagName(tag string) string {
	switch tag {
	case "!!int", "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	}
	return "not text"
}
