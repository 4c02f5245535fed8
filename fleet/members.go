package fleet

// Members counts the live processes of a fleet, so a process can take its
// share of a fleet-wide limit when the shared store cannot be reached, or
// scale a burst that would otherwise multiply with the replica count.
//
// Implementations must be safe for concurrent use and must not block: Live
// reports what was last learnt, and a process that has learnt nothing yet
// counts only itself.
type Members interface {
	// Live returns the number of processes seen alive recently, this one
	// included; it is at least 1.
	Live() int
}

// Fixed is a Members of a fleet whose size is known in advance, such as a
// deployment with a fixed replica count; values below 1 count as 1.
type Fixed int

// Live returns n, or 1 when n is below 1.
func (n Fixed) Live() int { return max(int(n), 1) }
