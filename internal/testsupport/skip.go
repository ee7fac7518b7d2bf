package testsupport

import (
	"fmt"
	"os"
	"testing"
)

// InCI reports whether the tests run in CI (CI=true), where every
// component the tests need is installed.
func InCI() bool { return os.Getenv("CI") == "true" }

// SkipUnlessCI skips t for want of something the test needs, saying what
// in format and args, except in CI, where it fails t instead: there a
// missing component is a broken setup that a skip would hide.
func SkipUnlessCI(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatal(msg + " (CI=true: every test must run)")
	} else {
		t.Skip(msg)
	}
}
