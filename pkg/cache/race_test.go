//go:build race

package cache

// raceEnabled reports a build with the race detector.
const raceEnabled = true
