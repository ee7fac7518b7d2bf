//go:build race

package routing

// raceEnabled reports a build with the race detector, under which sync.Pool
// drops objects at random and allocation counts mean nothing.
const raceEnabled = true
