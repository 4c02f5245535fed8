package series

// The modules extra/prom and extra/otel may not import this package (it is
// internal to the core module), so each keeps a copy of it, made by this
// directive and held identical by a test of the integration module.
//go:generate sh -c "for m in prom otel; do rm -rf ../../extra/${DOLLAR}m/internal/series && mkdir -p ../../extra/${DOLLAR}m/internal/series && cp *.go ../../extra/${DOLLAR}m/internal/series/; done"
