package testsupport

import "testing"

// recorder is a testing.TB that records how a test ended.
type recorder struct {
	testing.TB
	skipped, failed bool
}

func (r *recorder) Helper()             {}
func (r *recorder) Skip(...any)         { r.skipped = true }
func (r *recorder) Fatal(...any)        { r.failed = true }
func (r *recorder) Name() string        { return "recorder" }
func (r *recorder) Logf(string, ...any) {}

func TestSkipUnlessCIFailsInCI(t *testing.T) {
	for _, tt := range []struct {
		ci                    string
		wantSkipped, wantFail bool
	}{
		{"", true, false},
		{"false", true, false},
		{"true", false, true},
	} {
		t.Setenv("CI", tt.ci)
		r := &recorder{}
		SkipUnlessCI(r, "%s missing", "etcd")
		if r.skipped != tt.wantSkipped || r.failed != tt.wantFail {
			t.Errorf("CI=%q: skipped %v failed %v, want %v %v", tt.ci, r.skipped, r.failed, tt.wantSkipped, tt.wantFail)
		}
	}
}
