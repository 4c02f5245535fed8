//go:build race

package lab

// raceEnabled: built with the race detector, under which sync.Pool drops
// pooled objects at random, so allocation counts are not those of a
// normal build.
const raceEnabled = true
