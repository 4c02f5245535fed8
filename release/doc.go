// Package release holds the release tooling of the guardrail modules:
// tag.sh tags every published module in dependency order, and the test
// in this directory publishes them to a file-system module proxy and
// builds consumers against it. The module is never published.
package release
