module github.com/guardrail-go/guardrail/guardgrpc/grpcconfig

go 1.26.0

require (
	github.com/guardrail-go/guardrail v0.0.0-00010101000000-000000000000
	github.com/guardrail-go/guardrail/config v0.0.0-00010101000000-000000000000
	github.com/guardrail-go/guardrail/guardgrpc v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.85.0
)

require (
	github.com/guardrail-go/guardrail/ratelimit v0.0.0-00010101000000-000000000000 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/guardrail-go/guardrail => ../..

replace github.com/guardrail-go/guardrail/config => ../../config

replace github.com/guardrail-go/guardrail/guardgrpc => ..

replace github.com/guardrail-go/guardrail/ratelimit => ../../ratelimit
