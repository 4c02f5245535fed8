module github.com/guardrail-go/guardrail/cmd/guardrail

go 1.26.0

require github.com/guardrail-go/guardrail v0.1.0

require github.com/guardrail-go/guardrail/extra/vet v0.1.0

require github.com/guardrail-go/guardrail/extra/redisstore v0.1.0

require (
	github.com/guardrail-go/guardrail/extra/pgstore v0.1.0
	github.com/jackc/pgx/v5 v5.13.0
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.5
	golang.org/x/tools v0.52.0
)

require (
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/guardrail-go/guardrail/extra/config v0.1.0
	github.com/guardrail-go/guardrail/extra/ratelimit v0.1.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/mod v0.42.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

require (
	github.com/guardrail-go/guardrail/extra/guardgrpc v0.1.0
	google.golang.org/grpc v1.85.0
)
