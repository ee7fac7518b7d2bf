package transport

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The paced benchmark runs this binary as its publisher.
	if spec := os.Getenv(pacedPublisherEnv); spec != "" {
		if err := runPacedPublisher(spec); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
