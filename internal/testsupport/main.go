package testsupport

import (
	"fmt"
	"os"
)

// Runner runs a package's tests and returns their exit code, as
// *testing.M does.
type Runner interface {
	Run() int
}

// RunInTempDir is a TestMain body for tests that need files made once for
// the whole package, such as built binaries: it makes a temporary
// directory named after pattern (as os.MkdirTemp does), calls prepare with
// it, runs the tests with m.Run (m is TestMain's *testing.M), removes the
// directory and returns the exit code for os.Exit. When the directory
// cannot be made or prepare fails, it prints the error to stderr and
// returns 1 without running the tests.
func RunInTempDir(m Runner, pattern string, prepare func(dir string) error) int {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		fmt.Fprintf(os.Stderr, "make a temporary directory: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := prepare(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
