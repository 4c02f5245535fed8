// Package bench compares the cost per call of guardrail with other Go
// resilience libraries. It holds only benchmarks: run ./run.sh, or
// go test -bench . -benchmem in this directory. It is a module of its own so
// that guardrail itself depends on none of the libraries it is compared with.
package bench
