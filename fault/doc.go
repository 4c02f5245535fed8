// Package fault injects failures into HTTP traffic, on the server side as an
// http.Handler middleware and on the client side as an http.RoundTripper, so
// that tests and game days can prove what a client does when its dependency
// is slow, flaky or dead. The same rules apply to any function call (Wrap)
// and, through package grpcfault of the guardgrpc module, to gRPC calls.
//
// An Injector holds an ordered list of Rules. Each Rule matches requests by
// method, host, path and header, fires with a probability, and applies one
// Fault: Latency, Status (an error status with an optional Retry-After),
// Reset, Hang, SlowBody, StallBody, Truncate, LoseResponse or Refuse. Every
// fault is what a real network or server does, down to the error values: an
// injected reset is a syscall.ECONNRESET on a real socket, a truncated body is
// io.ErrUnexpectedEOF, a refused connection is syscall.ECONNREFUSED.
//
// Rules are evaluated in order. Latency rules add up; the first other fault
// that fires ends the evaluation and is applied after the summed delay. Each
// rule counts the requests it matched and the times it fired (see Counters),
// so a game day can set what was injected against what the client saw.
//
// Randomness comes from one Config.Rand, a func() float64 like every Rand of
// guardrail; NewRand(seed) makes one that replays the same faults for the
// same sequence of requests.
//
// Rules can be written in Go, or read from a JSON or YAML file with
// ParseConfig, and changed at run time through the admin endpoint (Admin),
// which accepts only loopback clients unless told otherwise, and refuses
// what a web page can make a browser send to it. A request may ask
// for its own fault with the X-Fault header only when Config.HeaderFaults is
// set: left on, it would let any caller break the server.
package fault
