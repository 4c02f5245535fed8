//go:build !race

package lab

// raceEnabled: built with the race detector (see race.go).
const raceEnabled = false
