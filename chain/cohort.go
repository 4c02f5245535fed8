package chain

import (
	"encoding/binary"
	"hash/fnv"
	"time"
)

// Consistent shedding. When the tiers of a chain shed independently, each
// drops different requests: a request admitted by one tier and refused by
// the next has wasted the first tier's work, and the chain's goodput falls
// with every tier that sheds. A request's cohort, a number derived from
// its user's key and carried along the chain, lets every tier refuse the
// same requests: a server that must shed raises its admission level and
// refuses the cohorts below it (shed.Config.ByCohort), tells its callers
// its level on every answer (HeaderAdmission), and a caller's Server
// refuses at its door, before any work, the cohorts its dependencies would
// refuse (Config.Admission).
const (
	// HeaderCohort carries a request's cohort, a decimal number in
	// [0, Cohorts).
	HeaderCohort = "X-Request-Cohort"
	// HeaderAdmission carries, on an answer, the lowest cohort the server
	// admits now, a decimal number in [0, Cohorts]; absent means 0 (every
	// cohort).
	HeaderAdmission = "X-Admission-Level"
	// MDCohort is HeaderCohort as gRPC request metadata.
	MDCohort = "x-request-cohort"
	// MDAdmission is HeaderAdmission as gRPC trailer metadata.
	MDAdmission = "x-admission-level"

	// Cohorts is the number of cohorts. 128 steps let a level shed less
	// than one percent of the traffic at a time.
	Cohorts = 128

	// DefaultCohortRotation is how long a key keeps its cohort: every hour
	// each key draws another, so that nobody is always the first shed.
	DefaultCohortRotation = time.Hour
)

// CohortOf returns the cohort of key at now, when cohorts rotate every
// rotate (zero or negative means DefaultCohortRotation). It is the same in
// every process that asks, whatever its seed: a hash of the key and of the
// rotation's number, not a random draw.
func CohortOf(key string, now time.Time, rotate time.Duration) int {
	if rotate <= 0 {
		rotate = DefaultCohortRotation
	}
	epoch := now.UnixNano() / int64(rotate)
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(epoch))
	_, _ = h.Write(b[:])
	_, _ = h.Write([]byte(key))
	return int(h.Sum64() % Cohorts)
}

// ParseCohort parses an X-Request-Cohort value: a decimal number in
// [0, Cohorts), spaces around it ignored. Anything else reports false,
// and the request has no cohort.
func ParseCohort(v string) (int, bool) {
	n, ok := parseDigits(v, 3)
	return n, ok && n < Cohorts
}

// ParseAdmission parses an X-Admission-Level value: a decimal number in
// [0, Cohorts], spaces around it ignored. Anything else reports false,
// and the level is ignored.
func ParseAdmission(v string) (int, bool) {
	n, ok := parseDigits(v, 3)
	return n, ok && n <= Cohorts
}

// Cohort returns the cohort of the request being served, and false when
// it has none (a nil State, or a request that came without one).
func (s *State) Cohort() (int, bool) {
	if s == nil || s.cohort == 0 {
		return 0, false
	}
	return int(s.cohort - 1), true
}

// SetCohort sets the cohort of the request being served; values outside
// [0, Cohorts) clear it. A nil State does nothing.
func (s *State) SetCohort(c int) {
	if s == nil {
		return
	}
	if c < 0 || c >= Cohorts {
		s.cohort = 0
		return
	}
	s.cohort = int16(c + 1)
}
