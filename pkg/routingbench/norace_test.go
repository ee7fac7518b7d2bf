//go:build !race

package routingbench

const raceEnabled = false
