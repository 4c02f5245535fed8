package series

import (
	"fmt"
	"math"
)

// ConfigError is an invalid field of an adapter's Config. Its message
// names the field, what it held and what is allowed, and it Is the
// adapter's sentinel. Like most errors, it is not modified once returned
// and is safe for concurrent use.
type ConfigError struct {
	Pkg      string // the adapter's package name: the message's prefix
	Field    string // the field, as "Config.MaxLabelValues"
	Value    string // what it held, formatted
	Want     string // what is allowed
	Sentinel error  // the adapter's ErrInvalidConfig
}

// Error returns "pkg: Config.Field is value; want ...".
func (e *ConfigError) Error() string {
	return e.Pkg + ": " + e.Field + " is " + e.Value + "; want " + e.Want
}

// Is reports whether target is the adapter's sentinel.
func (e *ConfigError) Is(target error) bool { return target == e.Sentinel }

// CheckMaxValues checks a MaxLabelValues field: a count, so zero means
// DefaultMaxValues and a negative value is invalid.
func CheckMaxValues(pkg string, sentinel error, n int) error {
	if n < 0 {
		return &ConfigError{Pkg: pkg, Field: "Config.MaxLabelValues", Value: fmt.Sprint(n),
			Want: fmt.Sprintf("0 (the default, %d) or more", DefaultMaxValues), Sentinel: sentinel}
	}
	return nil
}

// CheckBuckets checks a field of histogram bucket boundaries: empty means
// the default; otherwise finite and strictly increasing, as both
// Prometheus and OpenTelemetry require.
func CheckBuckets(pkg string, sentinel error, field string, b []float64) error {
	for i, v := range b {
		if math.IsNaN(v) || math.IsInf(v, 0) || i > 0 && v <= b[i-1] {
			return &ConfigError{Pkg: pkg, Field: field, Value: fmt.Sprint(b),
				Want: "finite boundaries in strictly increasing order, or none for the default", Sentinel: sentinel}
		}
	}
	return nil
}
