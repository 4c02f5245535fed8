// Package idempotency makes retried POST and PATCH requests safe: HTTP
// middleware that runs a handler once per Idempotency-Key and replays the
// stored response to retries, with a Store interface shared by a fleet,
// on a protocol (Keys and Session) that other transports share.
//
// New builds a Server from a Store and a Config; its Middleware method
// wraps a handler. Keys are scoped by caller: Config.Scope names the
// caller of each request, or Config.SingleTenant says that there is only
// one; New refuses a Config with neither, because one caller could then be
// replayed another's response. Each caller holds at most
// Config.MaxKeysPerScope live keys (10,000 by default) in a ScopedStore,
// so that one caller cannot fill a shared store for the others.
//
// Keys is the protocol itself, whatever the transport: Begin looks a
// request's key up and returns the Session that holds it while the
// request runs, which then stores the answer or releases the key by one
// rule for every transport (see Keys). The HTTP middleware is a thin
// mapping onto it, as is guardgrpc's interceptor for gRPC.
//
// A handler that panics, or whose connection is hijacked, may have
// committed its side effect before, so its key is not run again: retries
// get a replayed 500 saying the outcome is unknown, until the key expires.
// A handler that knows it committed nothing calls Release first. Held and
// Confirm let a handler check that it still holds its key before a side
// effect; for a request without a key they return nil.
package idempotency
