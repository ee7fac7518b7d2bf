package gateway

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/internal/budget"
	"github.com/kvgate/kvgate/pkg/types"
)

// objectiveMap is an ObjectivePriorities of fixed objectives.
type objectiveMap map[string]int

func (m objectiveMap) Priority(name string) (int, bool) {
	p, ok := m[name]
	return p, ok
}

func TestObjectiveHeaderGivesTheRequestItsObjectivesPriority(t *testing.T) {
	objectives := objectiveMap{"batch": -1, "chat": 5, "b.x-1": 2, strings.Repeat("a", MaxObjectiveNameBytes): -4}
	tests := []struct {
		name, header string
		lookup       ObjectivePriorities
		want         int
		invalid      bool
	}{
		{"no header", "", objectives, 0, false},
		{"a sheddable objective", "batch", objectives, -1, false},
		{"an important objective", "chat", objectives, 5, false},
		{"dots and dashes", "b.x-1", objectives, 2, false},
		{"the longest name", strings.Repeat("a", MaxObjectiveNameBytes), objectives, -4, false},
		{"an unknown objective", "other", objectives, 0, false},
		{"no objectives read", "batch", nil, 0, false},
		{"over-long", strings.Repeat("a", MaxObjectiveNameBytes+1), objectives, 0, true},
		{"upper case", "Batch", objectives, 0, true},
		{"a space", "bat ch", objectives, 0, true},
		{"a leading dash", "-batch", objectives, 0, true},
		{"a trailing dot", "batch.", objectives, 0, true},
		{"a control byte", "batch\x00", objectives, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := newMetrics(nil, budget.New(1))
			if err != nil {
				t.Fatal(err)
			}
			g := &Gateway{metrics: m, priorities: tt.lookup}
			if got := g.priority(tt.header); got != tt.want {
				t.Errorf("priority(%q) = %d; want %d", tt.header, got, tt.want)
			}
			counted := counted(t, m.invalidObjectives)
			if want := map[bool]float64{false: 0, true: 1}[tt.invalid]; counted != want {
				t.Errorf("counted %v invalid objective names; want %v", counted, want)
			}
		})
	}
}

func TestPriorityLookupAllocatesNothing(t *testing.T) {
	m, err := newMetrics(nil, budget.New(1))
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{metrics: m, priorities: objectiveMap{"batch": -1}}
	if n := testing.AllocsPerRun(100, func() { g.priority("batch") }); n != 0 {
		t.Errorf("priority allocates %v times per request", n)
	}
}

func TestFairnessHeaderNamesTheRequestsFlowWithinItsBound(t *testing.T) {
	tests := []struct {
		name, header, want string
		invalid            bool
	}{
		{"no header", "", "", false},
		{"a tenant", "tenant-a", "tenant-a", false},
		{"spaces and punctuation", "team A/prod:1", "team A/prod:1", false},
		{"the longest id", strings.Repeat("x", types.MaxFairnessIDBytes), strings.Repeat("x", types.MaxFairnessIDBytes), false},
		{"over-long", strings.Repeat("x", types.MaxFairnessIDBytes+1), "", true},
		{"a control byte", "tenant\x00a", "", true},
		{"a newline", "tenant\na", "", true},
		{"a byte beyond ASCII", "ténant", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := newMetrics(nil, budget.New(1))
			if err != nil {
				t.Fatal(err)
			}
			g := &Gateway{metrics: m}
			if got := g.fairnessID(tt.header); got != tt.want {
				t.Errorf("fairnessID(%q) = %q; want %q", tt.header, got, tt.want)
			}
			counted := counted(t, m.invalidFairnessIDs)
			if want := map[bool]float64{false: 0, true: 1}[tt.invalid]; counted != want {
				t.Errorf("counted %v invalid fairness ids; want %v", counted, want)
			}
		})
	}
}
