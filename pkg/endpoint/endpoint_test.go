package endpoint

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// readyPod returns a Running, Ready pod at 10.0.0.1 with labels.
func readyPod(labels, annotations map[string]string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p", Labels: labels, Annotations: annotations},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.0.0.1",
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	}
}

func TestParseTrimsEveryValue(t *testing.T) {
	// A model label with a trailing space used to be indexed by the KV
	// event manager as "llama" and looked up by the Store as "llama ".
	p := readyPod(map[string]string{ModelNameLabel: "llama ", ModelPortLabel: " 8100", LoraIDLabel: " 7 ",
		KVEventsEnabledLabel: "true "}, map[string]string{LoraAdaptersAnnotation: " sql , chat,sql,, "})
	e := Parse(p, Options{})
	if e.Model != "llama" || e.Port != 8100 || e.LoraID != "7" || !e.KVEvents || !slices.Equal(e.Adapters, []string{"sql", "chat"}) {
		t.Fatalf("Parse = model %q port %d lora id %q kv events %v adapters %q; want every value trimmed",
			e.Model, e.Port, e.LoraID, e.KVEvents, e.Adapters)
	}
	if e.Key != (Key{Namespace: "ns", Name: "p"}) || e.ID != "ns/p" || e.Address != "10.0.0.1:8100" || !e.Ready() || e.Pod != p {
		t.Fatalf("Parse = key %v id %q address %q ready %v", e.Key, e.ID, e.Address, e.Ready())
	}
}

func TestPorts(t *testing.T) {
	tests := []struct {
		name                 string
		labels, annotations  map[string]string
		wantServing, wantMet int
		wantDeclared         int
	}{
		{"defaults", nil, nil, 8000, 8000, 0},
		{"port label serves both", map[string]string{ModelPortLabel: "8100"}, nil, 8100, 8100, 8100},
		{"metric port label", map[string]string{ModelPortLabel: "8100", MetricPortLabel: "9100"}, nil, 8100, 9100, 8100},
		{"annotations", nil, map[string]string{ModelPortLabel: "8200", MetricPortLabel: "9200"}, 8200, 9200, 8200},
		{"label beats annotation", map[string]string{ModelPortLabel: "8300"}, map[string]string{ModelPortLabel: "8400"}, 8300, 8300, 8300},
		{"invalid metric port falls back", map[string]string{ModelPortLabel: "8100", MetricPortLabel: "http"}, nil, 8100, 8100, 8100},
		{"out of range", map[string]string{ModelPortLabel: "70000"}, nil, 8000, 8000, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := Parse(readyPod(tt.labels, tt.annotations), Options{DefaultPort: 8000})
			if e.Port != tt.wantServing || e.MetricsPort != tt.wantMet || e.DeclaredPort != tt.wantDeclared {
				t.Errorf("ports: serving %d metrics %d declared %d, want %d, %d, %d",
					e.Port, e.MetricsPort, e.DeclaredPort, tt.wantServing, tt.wantMet, tt.wantDeclared)
			}
		})
	}
	if e := Parse(readyPod(nil, nil), Options{DefaultPort: 9000}); e.Port != 9000 || e.Address != "10.0.0.1:9000" {
		t.Errorf("with default port 9000: port %d address %q", e.Port, e.Address)
	}
}

func TestReadiness(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name   string
		adjust func(*v1.Pod)
		want   UnreadyReason
	}{
		{"ready", func(*v1.Pod) {}, ""},
		{"terminating", func(p *v1.Pod) { p.DeletionTimestamp = &now }, Terminating},
		{"pending", func(p *v1.Pod) { p.Status.Phase = v1.PodPending }, NotRunning},
		{"no IP", func(p *v1.Pod) { p.Status.PodIP = "" }, NoIP},
		{"not ready", func(p *v1.Pod) { p.Status.Conditions[0].Status = v1.ConditionFalse }, NotReady},
		{"no ready condition", func(p *v1.Pod) { p.Status.Conditions = nil }, NotReady},
		{"ray worker", func(p *v1.Pod) { p.Labels = map[string]string{RayNodeTypeLabel: "worker"} }, RayWorker},
		{"ray head", func(p *v1.Pod) { p.Labels = map[string]string{RayNodeTypeLabel: "head"} }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := readyPod(nil, nil)
			tt.adjust(p)
			if got := Readiness(p); got != tt.want {
				t.Fatalf("Readiness = %q, want %q", got, tt.want)
			}
			if e := Parse(p, Options{}); e.Unready != tt.want || e.Ready() != (tt.want == "") {
				t.Fatalf("Parse: unready %q ready %v", e.Unready, e.Ready())
			}
		})
	}
	if e := Parse(readyPod(nil, nil), Options{}); e.Model != "" || e.KVEvents || e.Adapters != nil {
		t.Fatalf("a pod without labels: model %q kv events %v adapters %v", e.Model, e.KVEvents, e.Adapters)
	}
}

func TestDeploymentName(t *testing.T) {
	yes := true
	rs := func(name string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{Kind: "ReplicaSet", Name: name, Controller: &yes}}
	}
	tests := []struct {
		name   string
		labels map[string]string
		owners []metav1.OwnerReference
		want   string
	}{
		{"label", map[string]string{DefaultDeploymentLabel: "llama-a100"}, rs("other-5d8f7c9b4"), "llama-a100"},
		{"replicaset minus template hash", map[string]string{"pod-template-hash": "5d8f7c9b4"}, rs("llama-a100-5d8f7c9b4"), "llama-a100"},
		{"replicaset without hash label", nil, rs("llama-h100-7f9c"), "llama-h100"},
		{"not a controller", nil, []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "x-1"}}, ""},
		{"statefulset", nil, []metav1.OwnerReference{{Kind: "StatefulSet", Name: "x", Controller: &yes}}, ""},
		{"nothing", nil, nil, ""},
		{"ray cluster fleet", map[string]string{DefaultRayClusterFleetLabel: "qwen-fleet", DefaultDeploymentLabel: "kuberay", RayIsNodeLabel: "yes"},
			rs("ignored-5d8f7c9b4"), "qwen-fleet"},
		{"ray node without fleet ignores kuberay's name label", map[string]string{DefaultDeploymentLabel: "kuberay", RayIsNodeLabel: "yes"},
			[]metav1.OwnerReference{{Kind: "RayCluster", Name: "qwen-7b-x2v", Controller: &yes}}, "qwen-7b-x2v"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: tt.labels, OwnerReferences: tt.owners}}
			if got := DeploymentName(p, Options{}); got != tt.want {
				t.Fatalf("DeploymentName = %q, want %q", got, tt.want)
			}
			if got := Parse(p, Options{}).Deployment; got != tt.want {
				t.Fatalf("Parse(...).Deployment = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestAdaptersReadsTheCommaSeparatedList(t *testing.T) {
	tests := []struct {
		name                string
		labels, annotations map[string]string
		want                []string
	}{
		{"none", nil, nil, nil},
		{"annotation", nil, map[string]string{LoraAdaptersAnnotation: " sql-lora , chat-lora,,sql-lora "}, []string{"sql-lora", "chat-lora"}},
		{"label of one adapter", map[string]string{LoraAdaptersAnnotation: "sql-lora"}, nil, []string{"sql-lora"}},
		{"empty", nil, map[string]string{LoraAdaptersAnnotation: " , "}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Adapters(readyPod(tt.labels, tt.annotations)); !slices.Equal(got, tt.want) {
				t.Fatalf("Adapters = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseReadsTheDataParallelRanks(t *testing.T) {
	tests := []struct {
		name            string
		annotations     map[string]string
		wantSize, start int
	}{
		{"none", nil, 1, 0},
		{"size", map[string]string{DPSizeAnnotation: "4"}, 4, 0},
		{"size and start", map[string]string{DPSizeAnnotation: "2", DPStartRankAnnotation: "2"}, 2, 2},
		{"size out of range", map[string]string{DPSizeAnnotation: "0"}, 1, 0},
		{"start past the last rank", map[string]string{DPSizeAnnotation: "2", DPStartRankAnnotation: "255"}, 2, 0},
		{"not numbers", map[string]string{DPSizeAnnotation: "two", DPStartRankAnnotation: "one"}, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := Parse(readyPod(nil, tt.annotations), Options{})
			if e.DPSize != tt.wantSize || e.DPStartRank != tt.start {
				t.Errorf("DPSize %d DPStartRank %d, want %d and %d", e.DPSize, e.DPStartRank, tt.wantSize, tt.start)
			}
		})
	}
}
