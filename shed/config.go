package shed

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"
)

// ErrInvalidConfig is the sentinel of every error New returns for a Config
// field that holds a value with no meaning; New's error names every such
// field, not only the first.
var ErrInvalidConfig = errors.New("shed: invalid config")

// configError reports one invalid field. It Is ErrInvalidConfig.
type configError struct{ msg string }

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }

// validate reports every field of c that holds a value with no meaning,
// naming it, what it held and what is allowed, in one error per field
// joined. Zero fields are the defaults and always valid.
func (c *Config) validate() error {
	var errs []error
	bad := func(field string, got any, want string) { errs = append(errs, invalid(field, got, want)) }
	if c.Limit < 0 {
		bad("Limit", c.Limit, "0 (adaptive) or more")
	}
	if c.MaxQueue < 0 {
		bad("MaxQueue", c.MaxQueue, "0 (no queue) or more")
	}
	if c.RetryBurst < 0 || math.IsNaN(c.RetryBurst) || math.IsInf(c.RetryBurst, 0) {
		bad("RetryBurst", c.RetryBurst, "0 (the default 10) or more")
	}
	if math.IsNaN(c.RetryRatio) || math.IsInf(c.RetryRatio, 0) {
		bad("RetryRatio", c.RetryRatio, "a finite number: 0 for the default 0.1, negative for no limit")
	}
	if !unitOrZero(c.RetryPressure) {
		bad("RetryPressure", c.RetryPressure, "a value in (0, 1], or 0 for the default 0.5")
	}
	if c.QueueInterval < 0 {
		bad("QueueInterval", c.QueueInterval, "0 (the default 100ms) or more")
	}
	if c.MaxQueueWait < 0 {
		bad("MaxQueueWait", c.MaxQueueWait, "0 (QueueInterval) or more")
	}
	if c.QueueTarget < 0 {
		bad("QueueTarget", c.QueueTarget, "0 (the default 5ms) or more")
	}
	if c.RetryAfter < 0 {
		bad("RetryAfter", c.RetryAfter, "0 (the default 1s) or more")
	}
	if c.MaxHeaderPriority != 0 && !c.MaxHeaderPriority.valid() {
		bad("MaxHeaderPriority", c.MaxHeaderPriority, "0 (Normal) or Sheddable..Critical")
	}
	keys := make([]Priority, 0, len(c.Shares))
	for p := range c.Shares {
		keys = append(keys, p)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	for _, p := range keys {
		if v := c.Shares[p]; !p.valid() {
			errs = append(errs, &configError{fmt.Sprintf("shed: Config.Shares has an entry for %v; want Sheddable..Critical", p)})
		} else if !unitOrZero(v) {
			errs = append(errs, &configError{fmt.Sprintf("shed: Config.Shares[%v] is %v; want a value in (0, 1], or 0 for the default", p, v)})
		}
	}
	errs = append(errs, c.Adaptive.validate(bad)...)
	return errors.Join(errs...)
}

func (a *Adaptive) validate(bad func(field string, got any, want string)) []error {
	if a.InitialLimit < 0 {
		bad("Adaptive.InitialLimit", a.InitialLimit, "0 (the default 20) or more")
	}
	if a.MinLimit < 0 {
		bad("Adaptive.MinLimit", a.MinLimit, "0 (the default 3) or more")
	}
	if a.MaxLimit < 0 {
		bad("Adaptive.MaxLimit", a.MaxLimit, "0 (the default 1000) or more")
	}
	if a.Window < 0 {
		bad("Adaptive.Window", a.Window, "0 (the default 50ms) or more")
	}
	if !unitOrZero(a.Percentile) {
		bad("Adaptive.Percentile", a.Percentile, "a value in (0, 1], or 0 for the mean")
	}
	if a.Buffer < 0 || math.IsNaN(a.Buffer) || math.IsInf(a.Buffer, 0) {
		bad("Adaptive.Buffer", a.Buffer, "0 (the default 0.1) or more")
	}
	if a.MinRTTInterval < 0 {
		bad("Adaptive.MinRTTInterval", a.MinRTTInterval, "0 (the default 60s) or more")
	}
	if a.MinRTTSamples < 0 {
		bad("Adaptive.MinRTTSamples", a.MinRTTSamples, "0 (the default 50) or more")
	}
	if !unitOrZero(a.Smoothing) {
		bad("Adaptive.Smoothing", a.Smoothing, "a value in (0, 1], or 0 for the default 1")
	}
	if a.MinLimit >= 0 && a.MaxLimit >= 0 {
		if lo, hi := orInt(a.MinLimit, defaultMinLimit), orInt(a.MaxLimit, defaultMaxLimit); hi < lo {
			return []error{&configError{fmt.Sprintf("shed: Config.Adaptive.MaxLimit is %d (%d in force); want at least Adaptive.MinLimit's %d", a.MaxLimit, hi, lo)}}
		}
	}
	return nil
}

// unitOrZero reports whether v is 0 (a default) or in (0, 1].
func unitOrZero(v float64) bool { return v >= 0 && v <= 1 }

func invalid(field string, got any, want string) error {
	if d, ok := got.(time.Duration); ok {
		got = d.String()
	}
	return &configError{fmt.Sprintf("shed: Config.%s is %v; want %s", field, got, want)}
}
