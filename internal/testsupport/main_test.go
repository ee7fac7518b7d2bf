package testsupport

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeRunner records the directory's state when the tests would run.
type fakeRunner struct {
	dir     string
	ran     bool
	content string
	code    int
}

func (r *fakeRunner) Run() int {
	r.ran = true
	b, _ := os.ReadFile(filepath.Join(r.dir, "prepared"))
	r.content = string(b)
	return r.code
}

func TestRunInTempDirPreparesRunsAndRemovesTheDirectory(t *testing.T) {
	r := &fakeRunner{code: 3}
	code := RunInTempDir(r, "testsupport-main-", func(dir string) error {
		r.dir = dir
		return os.WriteFile(filepath.Join(dir, "prepared"), []byte("yes"), 0o644)
	})
	if code != 3 || !r.ran || r.content != "yes" {
		t.Fatalf("code %d, ran %v, saw %q; want the tests' code 3 after prepare wrote its file", code, r.ran, r.content)
	}
	if !strings.Contains(filepath.Base(r.dir), "testsupport-main-") {
		t.Errorf("directory %s is not named after the pattern", r.dir)
	}
	if _, err := os.Stat(r.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s left behind: %v", r.dir, err)
	}
}

func TestRunInTempDirSkipsTheTestsWhenPrepareFails(t *testing.T) {
	r := &fakeRunner{}
	code := RunInTempDir(r, "testsupport-main-", func(dir string) error {
		r.dir = dir
		return errors.New("build failed")
	})
	if code != 1 || r.ran {
		t.Fatalf("code %d, ran %v; want 1 without running the tests", code, r.ran)
	}
	if _, err := os.Stat(r.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s left behind: %v", r.dir, err)
	}
}
