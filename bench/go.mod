module github.com/guardrail-go/guardrail/bench

go 1.26.0

require (
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/eapache/go-resiliency v1.7.0
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/guardrail-go/guardrail v0.1.0
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/sony/gobreaker/v2 v2.4.0
	golang.org/x/perf v0.0.0-20260908200009-22c9c6c9d4da
	golang.org/x/sync v0.23.0
)

require (
	github.com/aclements/go-moremath v0.0.0-20210112150236-f10218a38794 // indirect
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/influxdata/tdigest v0.0.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

require (
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/guardrail-go/guardrail/extra/guardgrpc v0.1.0
	github.com/guardrail-go/guardrail/extra/redisstore v0.1.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/platinummonkey/go-concurrency-limits v1.0.0
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.85.0
)
