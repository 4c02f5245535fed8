package shed

import (
	"strconv"
	"strings"
)

// Priority orders requests for shedding: the lower the priority, the earlier
// (at the lower utilisation) it is refused. The zero Priority is not a valid
// priority; the Shedder treats it, like any value outside Sheddable..Critical,
// as Normal. A Priority is a plain value, safe to share.
type Priority uint8

// The priorities, from the first shed to the last. In a shop, for example:
// checkout is Critical, cart High, browsing Normal, recommendations Low,
// analytics Sheddable.
const (
	Sheddable Priority = iota + 1
	Low
	Normal
	High
	Critical
)

const numPriorities = int(Critical) + 1 // indexable by Priority

var priorityNames = [numPriorities]string{
	Sheddable: "sheddable",
	Low:       "low",
	Normal:    "normal",
	High:      "high",
	Critical:  "critical",
}

// String returns the priority's lower-case name ("critical" ... "sheddable"),
// or "priority(N)" for a value outside the range.
func (p Priority) String() string {
	if p.valid() {
		return priorityNames[p]
	}
	return "priority(" + strconv.Itoa(int(p)) + ")"
}

func (p Priority) valid() bool { return p >= Sheddable && p <= Critical }

// normalize maps invalid priorities to Normal.
func (p Priority) normalize() Priority {
	if p.valid() {
		return p
	}
	return Normal
}

// ParsePriority parses a priority name as String writes it, ignoring ASCII
// case and surrounding spaces. It reports false for anything else.
func ParsePriority(s string) (Priority, bool) {
	if len(s) > 16 { // longer than any name: do not scan hostile input
		return 0, false
	}
	s = strings.TrimSpace(s)
	for p := Sheddable; p <= Critical; p++ {
		if strings.EqualFold(s, priorityNames[p]) {
			return p, true
		}
	}
	return 0, false
}
