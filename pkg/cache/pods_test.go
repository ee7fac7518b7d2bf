package cache

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPorts(t *testing.T) {
	tests := []struct {
		name                 string
		labels, annotations  map[string]string
		wantServing, wantMet int
	}{
		{"defaults", nil, nil, 8000, 8000},
		{"port label serves both", map[string]string{ModelPortLabel: "8100"}, nil, 8100, 8100},
		{"metric port label", map[string]string{ModelPortLabel: "8100", MetricPortLabel: "9100"}, nil, 8100, 9100},
		{"annotations", nil, map[string]string{ModelPortLabel: "8200", MetricPortLabel: "9200"}, 8200, 9200},
		{"label beats annotation", map[string]string{ModelPortLabel: "8300"}, map[string]string{ModelPortLabel: "8400"}, 8300, 8300},
		{"invalid metric port falls back", map[string]string{ModelPortLabel: "8100", MetricPortLabel: "http"}, nil, 8100, 8100},
		{"out of range", map[string]string{ModelPortLabel: "70000"}, nil, 8000, 8000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: tt.labels, Annotations: tt.annotations}}
			if got := ServingPort(p, 8000); got != tt.wantServing {
				t.Errorf("ServingPort = %d, want %d", got, tt.wantServing)
			}
			if got := MetricsPort(p, 8000); got != tt.wantMet {
				t.Errorf("MetricsPort = %d, want %d", got, tt.wantMet)
			}
		})
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: tt.labels, OwnerReferences: tt.owners}}
			if got := DeploymentName(p, DefaultDeploymentLabel); got != tt.want {
				t.Fatalf("DeploymentName = %q, want %q", got, tt.want)
			}
		})
	}
}
