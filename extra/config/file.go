package config

import "time"

// The types of this file are the policy file's schema, unexported: they
// mirror the file key for key (the yaml tags), and a nil pointer is a key
// the file leaves out. They declare no setting of their own: mapping.go
// maps each section onto the configuration type of the guardrail core
// that declares its fields.

// policyFile is the parsed policy file, as written: every field is a
// pointer (or a nil map or slice) when the file leaves it out, so that
// what a dependency overrides can be told from what it inherits.
// docs/config.md documents every key. Parse makes a new one each time.
type policyFile struct {
	// Version is the format's version; 1 is the only one, and the default.
	Version *int `yaml:"version"`
	// Defaults are the settings every dependency starts from: the platform
	// team's, reviewed once.
	Defaults *fileSettings `yaml:"defaults"`
	// Dependencies are the clients, by name: what the service calls.
	Dependencies map[string]*fileDependency `yaml:"dependencies"`
	// Servers are the server-side guardrails, by name: what the service
	// serves.
	Servers map[string]*fileServer `yaml:"servers"`
}

// fileReview is who stands behind a departure from the defaults, and why.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileReview struct {
	// Reason says why the settings differ from the defaults. It is required
	// as soon as a dependency sets anything the defaults set, so that every
	// difference is reviewed with its reason beside it.
	Reason *string `yaml:"reason"`
	// Owner is the team that owns the override. Optional.
	Owner *string `yaml:"owner"`
	// Decision links the decision record behind the override. Optional.
	Decision *string `yaml:"decision"`
}

// fileDependency is one dependency's client settings: the defaults, overridden
// field by field.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileDependency struct {
	fileReview `yaml:",inline"`
	// Kind is "http" (the default: Registry.HTTPClient), "grpc" (a
	// guardgrpc client: Registry.GRPC, which package
	// extra/grpcconfig installs on connections) or "policy" (a
	// guardrail.Policy for any other call: Registry.Policy).
	Kind *string `yaml:"kind"`
	// Calls names the dependencies this one calls in turn, when the file
	// describes the chain: it lets the checks compare their timeouts and
	// count the tiers that retry.
	Calls []string `yaml:"calls"`
	// Routes lists routes of the dependency whose idempotence matters to
	// retries. Descriptive: it only feeds the warnings.
	Routes       []*fileRoute `yaml:"routes"`
	fileSettings `yaml:",inline"`
}

// fileRoute is a route of a dependency, for the warnings about retries: an
// HTTP method and path, or a gRPC dependency's full method name
// ("/pkg.Service/Method") in Method alone.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileRoute struct {
	Method *string `yaml:"method"`
	Path   *string `yaml:"path"`
	// Idempotent says whether repeating the request is harmless. Nil means
	// what its method says (GET, HEAD, OPTIONS, PUT, DELETE are), or for
	// gRPC whether idempotent_methods lists it.
	Idempotent *bool `yaml:"idempotent"`
}

// fileSettings are the client settings of a dependency, or the defaults. Each
// field is the guardhttp.Config, guardgrpc.ClientConfig or guardrail.Policy
// field of the same name.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileSettings struct {
	MaxAttempts    *int           `yaml:"max_attempts"`
	AttemptTimeout *time.Duration `yaml:"attempt_timeout"`
	MinAttemptTime *time.Duration `yaml:"min_attempt_time"`
	MaxRetryAfter  *time.Duration `yaml:"max_retry_after"`
	// Deadline bounds a whole call, every attempt and backoff included: the
	// dependency's deadline budget. Zero or absent means none but the
	// caller's context.
	Deadline    *time.Duration   `yaml:"deadline"`
	Backoff     *fileBackoff     `yaml:"backoff"`
	RetryBudget *fileRetryBudget `yaml:"retry_budget"`
	Breaker     *fileBreaker     `yaml:"breaker"`
	Bulkhead    *fileBulkhead    `yaml:"bulkhead"`
	// Hedge turns on hedging: the section being there is what turns it
	// on, so hedge: {} hedges with the library's defaults.
	Hedge *fileHedge `yaml:"hedge"`
	// Throttle turns on client-side adaptive throttling: throttle: {}
	// throttles with the library's defaults.
	Throttle *fileThrottle `yaml:"throttle"`

	// HTTP only.
	ConnectTimeout        *time.Duration `yaml:"connect_timeout"`
	TLSHandshakeTimeout   *time.Duration `yaml:"tls_handshake_timeout"`
	WriteTimeout          *time.Duration `yaml:"write_timeout"`
	ResponseHeaderTimeout *time.Duration `yaml:"response_header_timeout"`
	BodyIdleTimeout       *time.Duration `yaml:"body_idle_timeout"`
	MaxBufferedBody       *int64         `yaml:"max_buffered_body"`
	IdempotencyKeys       *bool          `yaml:"idempotency_keys"`
	DeadlineReserve       *time.Duration `yaml:"deadline_reserve"`

	// gRPC only.
	IdempotentMethods   []string `yaml:"idempotent_methods"`
	MaxBufferedMessages *int     `yaml:"max_buffered_messages"`
	// FailureDomain is what gets a breaker and a bulkhead compartment of
	// its own: "target" (the default: the connection's target) or
	// "method" (each method of each target, guardgrpc.ByMethod).
	FailureDomain *string `yaml:"failure_domain"`

	// Policy only.
	Idempotent *bool `yaml:"idempotent"`
}

// fileBackoff selects a backoff.Strategy.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileBackoff struct {
	// Strategy is full_jitter (the default), equal_jitter, exponential,
	// decorrelated, constant or none.
	Strategy *string        `yaml:"strategy"`
	Base     *time.Duration `yaml:"base"`
	Cap      *time.Duration `yaml:"cap"`
}

// fileRetryBudget is a budget.Config, or an unlimited budget.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileRetryBudget struct {
	Ratio        *float64 `yaml:"ratio"`
	Max          *float64 `yaml:"max"`
	MinPerSecond *float64 `yaml:"min_per_second"`
	// Unlimited bounds retries by attempts and deadline alone.
	Unlimited *bool `yaml:"unlimited"`
}

// fileBreaker is a breaker.Config (and, for HTTP and gRPC, the group's
// limits).
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileBreaker struct {
	Window      *time.Duration `yaml:"window"`
	Buckets     *int           `yaml:"buckets"`
	CountWindow *int           `yaml:"count_window"`
	MinRequests *int           `yaml:"min_requests"`
	// ConsecutiveFailures trips the breaker on that many failures in a
	// row, for a dependency too quiet for a rate; 0 is off.
	ConsecutiveFailures *int           `yaml:"consecutive_failures"`
	FailureRate         *float64       `yaml:"failure_rate"`
	SlowCall            *time.Duration `yaml:"slow_call"`
	SlowRate            *float64       `yaml:"slow_rate"`
	OpenFor             *time.Duration `yaml:"open_for"`
	OpenJitter          *float64       `yaml:"open_jitter"`
	OpenBackoff         *float64       `yaml:"open_backoff"`
	MaxOpenFor          *time.Duration `yaml:"max_open_for"`
	HalfOpenProbes      *int           `yaml:"half_open_probes"`
	CloseAfter          *int           `yaml:"close_after"`
	// Mode is normal, metrics_only or disabled.
	Mode *string `yaml:"mode"`
	// MaxKeys and IdleTTL bound the group of breakers of an HTTP client
	// (one per host) or a gRPC one (one per target or method).
	MaxKeys *int           `yaml:"max_keys"`
	IdleTTL *time.Duration `yaml:"idle_ttl"`
}

// fileBulkhead is a bulkhead.Config; Disabled removes one the defaults set.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileBulkhead struct {
	MaxConcurrent *int           `yaml:"max_concurrent"`
	MaxQueue      *int           `yaml:"max_queue"`
	MaxWait       *time.Duration `yaml:"max_wait"`
	Disabled      *bool          `yaml:"disabled"`
}

// fileHedge is a guardrail.HedgeConfig; Disabled removes one the defaults
// set.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileHedge struct {
	Delay         *time.Duration `yaml:"delay"`
	Percentile    *float64       `yaml:"percentile"`
	MaxHedges     *int           `yaml:"max_hedges"`
	Window        *int           `yaml:"window"`
	OverloadPause *time.Duration `yaml:"overload_pause"`
	Disabled      *bool          `yaml:"disabled"`
}

// fileThrottle is a throttle.Config; Disabled removes one the
// defaults set.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileThrottle struct {
	Window   *time.Duration `yaml:"window"`
	K        *float64       `yaml:"k"`
	Disabled *bool          `yaml:"disabled"`
}

// fileServer is the server-side guardrails of one server (or route group).
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileServer struct {
	fileReview `yaml:",inline"`
	// Calls names the dependencies the server calls while it answers.
	Calls       []string         `yaml:"calls"`
	Deadline    *fileDeadline    `yaml:"deadline"`
	Shed        *fileShed        `yaml:"shed"`
	Idempotency *fileIdempotency `yaml:"idempotency"`
	RateLimit   *fileRateLimit   `yaml:"rate_limit"`
}

// fileRateLimit is a ratelimit.Config without its Key function, which
// says who a request is charged to and so cannot come from a file: the
// code passes it to Registry.RateLimiter.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileRateLimit struct {
	Rate    *float64 `yaml:"rate"`
	Burst   *int     `yaml:"burst"`
	MaxKeys *int     `yaml:"max_keys"`
	// IPv6PrefixBits is ratelimit.Config.IPv6PrefixBits: the prefix an
	// IPv6 client is charged by, with the default key.
	IPv6PrefixBits *int `yaml:"ipv6_prefix_bits"`
	// Shared makes rate, burst and max_keys hold across every process
	// that shares Options.TokenStore (a fleet.Limiter; see
	// ratelimit.Config.Shared).
	Shared *fileSharedLimit `yaml:"shared"`
}

// fileSharedLimit is a fleet.LimiterConfig without its Store, Rate, Burst
// and MaxKeys, which come from Options.TokenStore and the rate_limit
// section.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileSharedLimit struct {
	Lease         *time.Duration `yaml:"lease"`
	MaxLease      *int           `yaml:"max_lease"`
	StoreTimeout  *time.Duration `yaml:"store_timeout"`
	ProbeInterval *time.Duration `yaml:"probe_interval"`
	// OnStoreFailure is "open" (the default: this process's share of the
	// limit) or "closed" (refuse).
	OnStoreFailure *string `yaml:"on_store_failure"`
	// Members is the fleet's size for FailOpen's share (fleet.Fixed); 0
	// or absent means 1.
	Members *int `yaml:"members"`
}

// fileDeadline is a deadline.Config.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileDeadline struct {
	Max     *time.Duration `yaml:"max"`
	Reserve *time.Duration `yaml:"reserve"`
}

// fileShed is a shed.Config.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileShed struct {
	Limit         *int           `yaml:"limit"`
	MaxQueue      *int           `yaml:"max_queue"`
	RetryRatio    *float64       `yaml:"retry_ratio"`
	RetryBurst    *float64       `yaml:"retry_burst"`
	RetryPressure *float64       `yaml:"retry_pressure"`
	QueueInterval *time.Duration `yaml:"queue_interval"`
	MaxQueueWait  *time.Duration `yaml:"max_queue_wait"`
	QueueTarget   *time.Duration `yaml:"queue_target"`
	RetryAfter    *time.Duration `yaml:"retry_after"`
	// MaxHeaderPriority is sheddable, low, normal, high or critical.
	MaxHeaderPriority *string `yaml:"max_header_priority"`
	// Shares maps a priority name to its share of the limit.
	Shares   map[string]float64 `yaml:"shares"`
	Adaptive *fileAdaptive      `yaml:"adaptive"`
}

// fileAdaptive is a shed.fileAdaptive.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileAdaptive struct {
	InitialLimit   *int           `yaml:"initial_limit"`
	MinLimit       *int           `yaml:"min_limit"`
	MaxLimit       *int           `yaml:"max_limit"`
	Window         *time.Duration `yaml:"window"`
	Percentile     *float64       `yaml:"percentile"`
	Buffer         *float64       `yaml:"buffer"`
	MinRTTInterval *time.Duration `yaml:"min_rtt_interval"`
	MinRTTSamples  *int           `yaml:"min_rtt_samples"`
	Smoothing      *float64       `yaml:"smoothing"`
}

// fileIdempotency is an idempotency.Config without its functions.
// It is a plain value, safe to read concurrently and not to change while
// it is read.
type fileIdempotency struct {
	// Scope is "single_tenant" (every caller in one key scope) or "caller"
	// (the code passes the Scope function to Registry.Idempotency).
	Scope               *string        `yaml:"scope"`
	Methods             []string       `yaml:"methods"`
	Required            *bool          `yaml:"required"`
	MaxKeyLength        *int           `yaml:"max_key_length"`
	MaxBodyBytes        *int64         `yaml:"max_body_bytes"`
	MaxResponseBytes    *int           `yaml:"max_response_bytes"`
	MaxKeysPerScope     *int           `yaml:"max_keys_per_scope"`
	TTL                 *time.Duration `yaml:"ttl"`
	Lease               *time.Duration `yaml:"lease"`
	DisableLeaseRenewal *bool          `yaml:"disable_lease_renewal"`
	CancelOnLeaseLost   *bool          `yaml:"cancel_on_lease_lost"`
	StoreTimeout        *time.Duration `yaml:"store_timeout"`
	StoredHeaders       []string       `yaml:"stored_headers"`
	RetryAfter          *time.Duration `yaml:"retry_after"`
	FailOpen            *bool          `yaml:"fail_open"`
	DocsURL             *string        `yaml:"docs_url"`
}
