#!/usr/bin/env bash
# Runs the comparison and summarises it with benchstat.
#
#   ./run.sh                 every benchmark, 10 rounds of 0.5 s each
#   COUNT=20 ./run.sh        more rounds (at least 6: benchstat needs them)
#   BENCHTIME=1s ./run.sh    longer rounds
#   BENCH=Breaker ./run.sh   only the benchmarks matching a regexp
#
# Each round runs every benchmark once, and the rounds follow one another,
# so a burst of load from another process slows one round of every
# implementation instead of all six samples of one. Writes, under results/
# (or $OUT): machine.txt (CPU, cores, Go, OS, versions of every library),
# raw.txt (the go test output), table.txt (benchstat's summary) and
# table.md (the same as Markdown tables with ratios, for the README).
set -euo pipefail
cd "$(dirname "$0")"

count=${COUNT:-10}
benchtime=${BENCHTIME:-500ms}
bench=${BENCH:-.}
out=${OUT:-results}
mkdir -p "$out"

benchstat=$(command -v benchstat || true)
if [ -z "$benchstat" ]; then
	benchstat="$(go env GOPATH)/bin/benchstat"
	if [ ! -x "$benchstat" ]; then
		echo "installing benchstat" >&2
		go install golang.org/x/perf/cmd/benchstat@latest
	fi
fi

{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
	echo "cores: $(nproc 2>/dev/null || echo unknown)"
	echo "go: $(go env GOVERSION) $(go env GOOS)/$(go env GOARCH)"
	echo "os: $(uname -srm)"
	echo "guardrail: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- .. 2>/dev/null || echo ' (with uncommitted changes)')"
	echo "rounds: $count, -benchtime $benchtime each"
	echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
	echo "modules:"
	go list -m all | grep -E 'sony/gobreaker|failsafe-go|eapache/go-resiliency|cenkalti/backoff|go-retryablehttp|golang.org/x/sync' | sed 's/^/  /'
} >"$out/machine.txt"
cat "$out/machine.txt"

# Build once; every round runs the same binary.
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go test -c -o "$bin/bench.test" .

: >"$out/raw.txt"
for i in $(seq 1 "$count"); do
	echo "round $i of $count" >&2
	"$bin/bench.test" -test.run '^$' -test.bench "$bench" -test.benchtime "$benchtime" -test.count 1 -test.timeout 0 | tee -a "$out/raw.txt"
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)" >>"$out/machine.txt"

"$benchstat" "$out/raw.txt" | tee "$out/table.txt"
go run ./internal/benchtable -machine "$out/machine.txt" "$out/raw.txt" >"$out/table.md"
echo "Markdown tables: $out/table.md" >&2
