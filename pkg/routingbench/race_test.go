//go:build race

package routingbench

// raceEnabled reports a build with the race detector.
const raceEnabled = true
