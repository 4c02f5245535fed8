package guardgrpc

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/shed"
)

// Metadata keys read and written by the interceptors. gRPC metadata keys are
// lower case.
const (
	// MDPushback is the trailer by which a server asks the client to wait
	// before retrying (gRPC's retry design, A6): a non-negative number of
	// milliseconds, or a negative or malformed value meaning "do not retry".
	MDPushback = "grpc-retry-pushback-ms"
	// mdPreviousAttempts is the header grpc-go's own retries set on a
	// retried attempt: the number of attempts before this one.
	mdPreviousAttempts = "grpc-previous-rpc-attempts"
	// MDRetryAttempt is guardrail's attempt header, the gRPC spelling of
	// X-Retry-Attempt: 1 on the first retry, absent on the original.
	MDRetryAttempt = "x-retry-attempt"
	// MDPriority carries a call's priority by name ("critical", "high",
	// "normal", "low", "sheddable"), the gRPC spelling of
	// X-Request-Priority.
	MDPriority = "x-request-priority"
	// MDIdempotencyKey carries an idempotency key, the gRPC spelling of
	// Idempotency-Key.
	MDIdempotencyKey = "idempotency-key"
)

// maxPushback bounds a pushback value: gRPC defines it as a 32-bit count of
// milliseconds.
const maxPushback = 1<<31 - 1

// parsePushback parses one grpc-retry-pushback-ms value. It returns the
// delay and true for a non-negative decimal integer of at most 2^31-1
// milliseconds; false for anything else: gRPC's retry design says that a
// negative or malformed pushback means the client must not retry.
func parsePushback(v string) (time.Duration, bool) {
	if v == "" || len(v) > 10 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if n > maxPushback {
		return 0, false
	}
	return time.Duration(n) * time.Millisecond, true
}

// pushback reads the pushback of a trailer: present reports whether the
// server sent one; retry is false when it said not to retry (a negative,
// malformed or repeated value).
func pushback(md metadata.MD) (d time.Duration, present, retry bool) {
	v := md[MDPushback]
	switch len(v) {
	case 0:
		return 0, false, true
	case 1:
		d, ok := parsePushback(v[0])
		return d, true, ok
	}
	return 0, true, false
}

// parseAttempt parses an attempt count from x-retry-attempt or
// grpc-previous-rpc-attempts: a decimal number of at most 9 digits, spaces
// around it ignored. It reports false for anything else, which the server
// treats as an original call.
func parseAttempt(v string) (int, bool) { return shed.ParseRetryAttempt(v) }

// ParsePriority parses an x-request-priority value (see shed.ParsePriority)
// and caps it at maxPriority: metadata may lower a call's priority, never
// raise it above what the server allows. A missing or unknown value is
// Normal, also capped. An invalid maxPriority means Normal.
func parsePriority(v string, maxPriority shed.Priority) shed.Priority {
	if maxPriority < shed.Sheddable || maxPriority > shed.Critical {
		maxPriority = shed.Normal
	}
	p := shed.Normal
	if q, ok := shed.ParsePriority(v); ok {
		p = q
	}
	return min(p, maxPriority)
}

// isRetry reports whether incoming metadata says the call is a retry:
// grpc-go's grpc-previous-rpc-attempts or guardrail's x-retry-attempt above
// zero.
func isRetry(md metadata.MD) bool {
	for _, k := range [...]string{MDRetryAttempt, mdPreviousAttempts} {
		if v := md[k]; len(v) > 0 {
			if n, ok := parseAttempt(v[0]); ok && n > 0 {
				return true
			}
		}
	}
	return false
}

// first returns md's first value for key, or "".
func first(md metadata.MD, key string) string {
	if v := md[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// attemptContext returns ctx with the metadata attempt n (1-based) adds:
// MDRetryAttempt on a retry, chain.MDAmplification when the call is made
// for a request that is itself a retry somewhere up the chain, or is one
// here, and chain.MDCohort when that request has a cohort.
func attemptContext(ctx context.Context, n int) context.Context {
	st := chain.FromContext(ctx)
	if c, ok := st.Cohort(); ok {
		ctx = metadata.AppendToOutgoingContext(ctx, chain.MDCohort, strconv.Itoa(c))
	}
	amp := st.Outgoing(n)
	switch {
	case n > 1 && amp > 1:
		return metadata.AppendToOutgoingContext(ctx, MDRetryAttempt, strconv.Itoa(n-1), chain.MDAmplification, strconv.Itoa(amp))
	case n > 1:
		return metadata.AppendToOutgoingContext(ctx, MDRetryAttempt, strconv.Itoa(n-1))
	case amp > 1:
		return metadata.AppendToOutgoingContext(ctx, chain.MDAmplification, strconv.Itoa(amp))
	}
	return ctx
}
