module github.com/guardrail-go/guardrail/extra/grpcconfig

go 1.26.0

require (
	github.com/guardrail-go/guardrail v0.1.0
	github.com/guardrail-go/guardrail/extra/config v0.1.0
	github.com/guardrail-go/guardrail/extra/guardgrpc v0.1.0
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.85.0
)

require (
	github.com/guardrail-go/guardrail/extra/ratelimit v0.1.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
