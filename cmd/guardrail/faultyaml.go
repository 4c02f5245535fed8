package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/guardrail-go/guardrail/fault"
	"go.yaml.in/yaml/v3"
)

// maxFaultConfig is the largest fault rule file read: the 1 MiB that
// fault.ParseConfig accepts.
const maxFaultConfig = 1 << 20

// parseFaultConfig reads a fault rule file in JSON or YAML. The fault package
// reads JSON only, so that its module needs nothing outside the standard
// library; YAML is re-encoded as JSON here, so that one strict decoder checks
// both formats.
func parseFaultConfig(data []byte) (fault.Config, error) {
	if len(data) > maxFaultConfig {
		return fault.Config{}, fmt.Errorf("%w: document larger than %d bytes", fault.ErrInvalidConfig, maxFaultConfig)
	}
	if !json.Valid(data) {
		var err error
		if data, err = yamlToJSON(data); err != nil {
			return fault.Config{}, err
		}
	}
	return fault.ParseConfig(data)
}

// yamlToJSON re-encodes a YAML document as JSON, so that one strict decoder
// checks both formats.
func yamlToJSON(data []byte) ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("%w: %v", fault.ErrInvalidConfig, err)
	}
	v, err := jsonValue(v, 0)
	if err != nil {
		return nil, err
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", fault.ErrInvalidConfig, err)
	}
	return out, nil
}

// jsonValue turns YAML's maps with arbitrary keys into JSON objects.
func jsonValue(v any, depth int) (any, error) {
	if depth > 100 {
		return nil, fmt.Errorf("%w: document nested too deep", fault.ErrInvalidConfig)
	}
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			e, err := jsonValue(e, depth+1)
			if err != nil {
				return nil, err
			}
			v[k] = e
		}
		return v, nil
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("%w: key %v is not a string", fault.ErrInvalidConfig, k)
			}
			e, err := jsonValue(e, depth+1)
			if err != nil {
				return nil, err
			}
			m[ks] = e
		}
		return m, nil
	case []any:
		for i, e := range v {
			e, err := jsonValue(e, depth+1)
			if err != nil {
				return nil, err
			}
			v[i] = e
		}
		return v, nil
	case time.Time:
		return v.Format(time.RFC3339Nano), nil
	}
	return v, nil
}

// yamlBodies lets the fault admin endpoint, which reads JSON, take the
// rule files of PUT and POST /rules in YAML too. A body sent as JSON or as
// YAML (application/yaml, application/x-yaml, text/yaml, text/x-yaml) that
// is not JSON is re-encoded as JSON, and sent on as application/json,
// before admin reads it; one that is not YAML either is answered 400 with
// the parser's error. A body of any other type goes on untouched, for the
// admin endpoint to refuse: a web page can make a browser send text/plain
// or a form anywhere, but not a YAML or JSON type to another site.
func yamlBodies(admin http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.Method != http.MethodPut && r.Method != http.MethodPost) || !jsonOrYAML(r.Header.Get("Content-Type")) {
			admin.ServeHTTP(w, r)
			return
		}
		data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxFaultConfig))
		if err != nil {
			status := http.StatusBadRequest
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				status = http.StatusRequestEntityTooLarge
			}
			http.Error(w, "fault: reading the body: "+err.Error(), status)
			return
		}
		if !json.Valid(data) && len(bytes.TrimSpace(data)) > 0 {
			if data, err = yamlToJSON(data); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(data))
		r.ContentLength = int64(len(data))
		r.Header.Set("Content-Type", "application/json")
		admin.ServeHTTP(w, r)
	})
}

// jsonOrYAML reports whether a Content-Type is a JSON or a YAML type.
func jsonOrYAML(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	switch mt {
	case "application/json", "application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml":
		return true
	}
	return strings.HasSuffix(mt, "+json") || strings.HasSuffix(mt, "+yaml")
}
