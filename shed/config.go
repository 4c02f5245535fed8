package shed

import (
	"fmt"
	"math"
	"time"
)

// validate reports the first field of c that holds a value with no meaning,
// naming it, what it held and what is allowed. Zero fields are the defaults
// and always valid.
func (c *Config) validate() error {
	switch {
	case c.Limit < 0:
		return invalid("Limit", c.Limit, "0 (adaptive) or more")
	case c.MaxQueue < 0:
		return invalid("MaxQueue", c.MaxQueue, "0 (no queue) or more")
	case c.RetryBurst < 0 || math.IsNaN(c.RetryBurst) || math.IsInf(c.RetryBurst, 0):
		return invalid("RetryBurst", c.RetryBurst, "0 (the default 10) or more")
	case math.IsNaN(c.RetryRatio) || math.IsInf(c.RetryRatio, 0):
		return invalid("RetryRatio", c.RetryRatio, "a finite number: 0 for the default 0.1, negative for no limit")
	case !unitOrZero(c.RetryPressure):
		return invalid("RetryPressure", c.RetryPressure, "a value in (0, 1], or 0 for the default 0.5")
	case c.QueueInterval < 0:
		return invalid("QueueInterval", c.QueueInterval, "0 (the default 50ms) or more")
	case c.MaxQueueWait < 0:
		return invalid("MaxQueueWait", c.MaxQueueWait, "0 (QueueInterval) or more")
	case c.QueueTarget < 0:
		return invalid("QueueTarget", c.QueueTarget, "0 (the default 5ms) or more")
	case c.RetryAfter < 0:
		return invalid("RetryAfter", c.RetryAfter, "0 (the default 1s) or more")
	case c.MaxHeaderPriority != 0 && !c.MaxHeaderPriority.valid():
		return invalid("MaxHeaderPriority", c.MaxHeaderPriority, "0 (Normal) or Sheddable..Critical")
	}
	for p, v := range c.Shares {
		if !p.valid() {
			return fmt.Errorf("shed: Config.Shares has an entry for %v; want Sheddable..Critical", p)
		}
		if !unitOrZero(v) {
			return fmt.Errorf("shed: Config.Shares[%v] is %v; want a value in (0, 1], or 0 for the default", p, v)
		}
	}
	return c.Adaptive.validate()
}

func (a *Adaptive) validate() error {
	switch {
	case a.InitialLimit < 0:
		return invalid("Adaptive.InitialLimit", a.InitialLimit, "0 (the default 20) or more")
	case a.MinLimit < 0:
		return invalid("Adaptive.MinLimit", a.MinLimit, "0 (the default 3) or more")
	case a.MaxLimit < 0:
		return invalid("Adaptive.MaxLimit", a.MaxLimit, "0 (the default 1000) or more")
	case a.Window < 0:
		return invalid("Adaptive.Window", a.Window, "0 (the default 50ms) or more")
	case !unitOrZero(a.Percentile):
		return invalid("Adaptive.Percentile", a.Percentile, "a value in (0, 1], or 0 for the mean")
	case a.Buffer < 0 || math.IsNaN(a.Buffer) || math.IsInf(a.Buffer, 0):
		return invalid("Adaptive.Buffer", a.Buffer, "0 (the default 0.1) or more")
	case a.MinRTTInterval < 0:
		return invalid("Adaptive.MinRTTInterval", a.MinRTTInterval, "0 (the default 60s) or more")
	case a.MinRTTSamples < 0:
		return invalid("Adaptive.MinRTTSamples", a.MinRTTSamples, "0 (the default 50) or more")
	case !unitOrZero(a.Smoothing):
		return invalid("Adaptive.Smoothing", a.Smoothing, "a value in (0, 1], or 0 for the default 1")
	}
	if lo, hi := orInt(a.MinLimit, defaultMinLimit), orInt(a.MaxLimit, defaultMaxLimit); hi < lo {
		return fmt.Errorf("shed: Config.Adaptive.MaxLimit is %d (%d in force); want at least Adaptive.MinLimit's %d", a.MaxLimit, hi, lo)
	}
	return nil
}

// unitOrZero reports whether v is 0 (a default) or in (0, 1].
func unitOrZero(v float64) bool { return v >= 0 && v <= 1 }

func invalid(field string, got any, want string) error {
	if d, ok := got.(time.Duration); ok {
		got = d.String()
	}
	return fmt.Errorf("shed: Config.%s is %v; want %s", field, got, want)
}
