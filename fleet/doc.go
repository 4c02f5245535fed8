// Package fleet holds the interfaces through which guardrail shares limits,
// budgets and hints across the processes of a fleet.
//
// Breakers, the adaptive shed limit, the client throttle and the hedge's
// latency window stay per process on purpose: each must react to what its
// own instance sees. What a fleet must share (a rate limit per client, a
// concurrency cap a third party imposes on the whole company, the burst of
// retries at the onset of an outage, a Retry-After one instance was given)
// goes through a store every instance can reach. This package names what
// such a store must do, with nothing but the standard library, so the core
// packages can take one; the Redis implementations live in the redisstore
// module (redisfleet for the TokenStore of Limiter, redisbus for the Bus
// of Hints), and another engine can implement the same interfaces.
//
// What is here: Members, the live fleet size; Limiter, a rate limit per
// key on a shared TokenStore, spending leased tokens locally; Hints,
// advisory pauses and breaker openings published on a Bus; and, in
// package budget, a retry burst that follows Members.
//
// A shared store is never on the critical path of a call's safety: when it
// cannot be reached, each user of it falls back to an explicit, documented
// local behaviour and never blocks past the caller's deadline.
package fleet
