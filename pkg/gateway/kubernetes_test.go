package gateway

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// startAPIServer starts a kube-apiserver and etcd for t, serving the CRDs
// of the directories crds, skipping t when KUBEBUILDER_ASSETS is unset
// (failing it in CI), and returns a kubeconfig file reaching it.
func startAPIServer(t *testing.T, crds ...string) (string, *rest.Config) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		testsupport.SkipUnlessCI(t, "KUBEBUILDER_ASSETS is unset: run `make test` or KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh) go test")
	}
	logf.SetLogger(klog.Background().V(4))
	env := &envtest.Environment{CRDDirectoryPaths: crds, ErrorIfCRDPathMissing: len(crds) > 0}
	rc, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData, Token: rc.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "test"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path, rc
}

// createReadyPod creates pod in its namespace, then makes it Running and
// Ready at 127.0.0.1, as the kubelet would for an engine on this machine.
func createReadyPod(t *testing.T, client kubernetes.Interface, pod *v1.Pod) {
	t.Helper()
	ctx := context.Background()
	created, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1", PodIPs: []v1.PodIP{{IP: "127.0.0.1"}},
		Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}}
	if _, err := client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestKubernetesDiscoveryFromAKubeconfig(t *testing.T) {
	kubeconfig, rc := startAPIServer(t)
	client := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()
	e := newTestEngine(t, "vllm-0")

	f := &testFleet{t: t, engines: []*testEngine{e}}
	cfg := loadTestConfig(t, map[string]string{"KUBECONFIG": kubeconfig, "KVGATE_POD_NAMESPACE": "default",
		"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "20"})
	f.serve(cfg)
	f.waitReady()
	if status, list := get(t, f.url+"/v1/models"); status != http.StatusOK || list != `{"object":"list","data":[]}`+"\n" {
		t.Fatalf("/v1/models before any pod: %d %s", status, list)
	}

	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm-0",
			Labels: map[string]string{endpoint.ModelNameLabel: "llama", endpoint.KVEventsEnabledLabel: "true",
				endpoint.ModelPortLabel: strconv.Itoa(e.port)},
			Annotations: map[string]string{endpoint.PubPortAnnotation: strconv.Itoa(e.pubPort),
				endpoint.ReplayPortAnnotation: strconv.Itoa(e.replayPort)}},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	createReadyPod(t, client, pod)

	f.waitFollowed("default/vllm-0")
	tokens := toyTokens(sharedPrompt)
	e.storePrompt(tokens)
	testsupport.EventuallyWhy(t, "the index to hold the pod's blocks", func() (string, bool) {
		m := f.match(tokens)
		return mustJSON(m.Pods), len(m.Pods) == 1 && m.Pods[0].Pod == "default/vllm-0" && m.Pods[0].MatchedBlocks > 0
	})
	resp, body := post(t, f.url+"/v1/completions", completion(sharedPrompt, ""), nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderTargetPodName) != "default/vllm-0" {
		t.Fatalf("completion: %d from %q: %s", resp.StatusCode, resp.Header.Get(HeaderTargetPodName), body)
	}

	zero := int64(0)
	if err := client.CoreV1().Pods("default").Delete(ctx, "vllm-0", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	testsupport.EventuallyWhy(t, "the model to go with its pod", func() (string, bool) {
		resp, body := post(t, f.url+"/v1/completions", completion("hi", ""), nil)
		return string(body), resp.StatusCode == http.StatusNotFound && strings.Contains(string(body), codeModelNotFound)
	})
	testsupport.EventuallyWhy(t, "the manager and the index to forget the pod", func() (string, bool) {
		v := f.kvcache()
		for _, m := range v.Models {
			if len(m.Pods) > 0 {
				return mustJSON(v), false
			}
		}
		return "", true
	})
}
