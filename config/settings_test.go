package manifests

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
)

// settings are the gateway's settings in one installation, as the gateway
// loads them from its environment.
type settings struct {
	manifest gatewayManifest
	config   gateway.Config
	// tokenizerPort is the port of AIBRIX_VLLM_TOKENIZER_ENDPOINT_TEMPLATE,
	// which a pod's model.aibrix.ai/port overrides.
	tokenizerPort int
}

// loadSettings renders the kustomization in dir and loads the gateway's
// configuration from the environment its container gets, as the gateway
// does at start, failing t on any setting the gateway would refuse.
func loadSettings(t *testing.T, dir string) settings {
	t.Helper()
	s := settings{manifest: findGateway(t, render(t, dir))}
	env, _ := gatewayEnvironment(t, s.manifest)
	e := config.NewEnv(func(name string) (string, bool) {
		v, ok := env[name]
		return v.value, ok
	})
	s.config = gateway.LoadConfig(e)
	s.tokenizerPort = urlPort(e, config.TokenizerEndpointTemplate)
	if err := e.Err(); err != nil {
		t.Fatalf("config/%s: the gateway would refuse its settings: %v", dir, err)
	}
	return s
}

// urlPort returns the port of the URL template v (with one %s for a host,
// and the scheme's port when it names none), recording a template that is
// not a URL in e.
func urlPort(e *config.Env, v config.Var) int {
	tmpl := e.String(v)
	u, err := url.Parse(strings.Replace(tmpl, "%s", "192.0.2.1", 1))
	if err != nil {
		e.Errorf("%s=%q: %v", v.Name, tmpl, err)
		return 0
	}
	if p, err := strconv.Atoi(u.Port()); err == nil {
		return p
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

// TestGatewayLifecycleFitsItsDeployment checks the Deployment against the
// gateway's own settings: the container port named http, which the
// Service and the probes use, is the port the gateway listens on, and the
// pod's grace period outlasts the gateway's shutdown (the delay with
// /readyz failing, then the drain of requests in flight).
func TestGatewayLifecycleFitsItsDeployment(t *testing.T) {
	for _, dir := range []string{"default", "namespaced", poolSample} {
		t.Run(dir, func(t *testing.T) {
			s := loadSettings(t, dir)
			c, spec := s.manifest.container, s.manifest.deployment.Spec.Template.Spec
			_, listen, err := net.SplitHostPort(s.config.ListenAddress)
			if err != nil {
				t.Fatal(err)
			}
			if http := port(t, c, "http"); strconv.Itoa(int(http)) != listen {
				t.Errorf("container port http is %d, the gateway listens on %s", http, s.config.ListenAddress)
			}
			for probe, path := range map[*corev1.Probe]string{c.ReadinessProbe: "/readyz", c.LivenessProbe: "/healthz"} {
				if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != path || probe.HTTPGet.Port.StrVal != "http" {
					t.Errorf("want a probe of %s on port http, got %+v", path, probe)
				}
			}
			shutdown := s.config.ShutdownDelay + s.config.ShutdownTimeout
			if s.config.ShutdownDelay <= 0 || spec.TerminationGracePeriodSeconds == nil ||
				time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= shutdown {
				t.Errorf("grace period %v s, shutdown delay %v then timeout %v: want a delay, and a grace period beyond both",
					spec.TerminationGracePeriodSeconds, s.config.ShutdownDelay, s.config.ShutdownTimeout)
			}
		})
	}
}

// TestGatewayDiscoversWhatItsRBACGrants checks that each installation
// watches the pods its RBAC lets it read: every namespace with the
// ClusterRole of config/default, its own namespace with the Role of
// config/namespaced and with the Role of the InferencePool sample's picker.
func TestGatewayDiscoversWhatItsRBACGrants(t *testing.T) {
	tests := []struct {
		dir      string
		roleKind string
		// ownNamespace is true when the gateway must watch its own
		// namespace, false for every namespace.
		ownNamespace bool
		mode         string
	}{
		{"default", "ClusterRole", false, config.DiscoveryKubernetes},
		{"namespaced", "Role", true, config.DiscoveryKubernetes},
		{poolSample, "Role", true, config.DiscoveryInferencePool},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			s := loadSettings(t, tt.dir)
			want := ""
			if tt.ownNamespace {
				want = s.manifest.deployment.Namespace
			}
			if d := s.config.Discovery; d.Mode != tt.mode || d.Namespace != want {
				t.Errorf("the gateway discovers %s; want %s discovery in namespace %q", d, tt.mode, want)
			}
			roles := only(render(t, tt.dir), tt.roleKind)
			if len(roles) != 1 {
				t.Fatalf("%d %ss, want 1", len(roles), tt.roleKind)
			}
			if tt.ownNamespace && roles[0].GetNamespace() != want {
				t.Errorf("the Role is in namespace %q, the gateway in %q", roles[0].GetNamespace(), want)
			}
		})
	}
}

// TestGatewayServesItsAdminEndpointsApart checks the safe layout: the
// gateway serves /metrics and /debug on an admin listener, the container
// port named admin, which the Service the API's clients reach does not
// expose; with Prometheus on, its ServiceMonitor scrapes that port through
// a Service of its own.
func TestGatewayServesItsAdminEndpointsApart(t *testing.T) {
	for _, dir := range []string{"default", "namespaced"} {
		t.Run(dir, func(t *testing.T) {
			s := loadSettings(t, dir)
			_, adminPort, err := net.SplitHostPort(s.config.AdminListenAddress)
			if err != nil {
				t.Fatalf("KVGATE_ADMIN_LISTEN_ADDRESS=%q: the admin endpoints are on the API's port", s.config.AdminListenAddress)
			}
			if admin := port(t, s.manifest.container, "admin"); strconv.Itoa(int(admin)) != adminPort {
				t.Errorf("container port admin is %d, the admin listener %s", admin, s.config.AdminListenAddress)
			}
			for _, u := range only(render(t, dir), "Service") {
				svc := &corev1.Service{}
				fromUnstructured(t, u, svc)
				for _, p := range svc.Spec.Ports {
					if p.TargetPort.StrVal == "admin" || strconv.Itoa(int(p.TargetPort.IntVal)) == adminPort {
						t.Errorf("Service %s exposes the admin port", svc.Name)
					}
				}
			}
			objs := renderEnabling(t, dir, "prometheus")
			monitors := only(objs, "ServiceMonitor")
			if len(monitors) != 1 {
				t.Fatalf("%d ServiceMonitors with prometheus on, want 1", len(monitors))
			}
			selector, _, _ := unstructured.NestedMap(monitors[0].Object, "spec", "selector", "matchLabels")
			endpoints, _, _ := unstructured.NestedSlice(monitors[0].Object, "spec", "endpoints")
			if len(endpoints) != 1 || endpoints[0].(map[string]any)["port"] != "admin" {
				t.Fatalf("ServiceMonitor endpoints %v, want the port named admin", endpoints)
			}
			scraped := 0
			for _, u := range only(objs, "Service") {
				if !selects(selector, u.GetLabels()) {
					continue
				}
				scraped++
				svc := &corev1.Service{}
				fromUnstructured(t, u, svc)
				if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "admin" || svc.Spec.Ports[0].TargetPort.StrVal != "admin" {
					t.Errorf("the ServiceMonitor selects Service %s with ports %+v, want only admin", svc.Name, svc.Spec.Ports)
				}
			}
			if scraped != 1 {
				t.Errorf("the ServiceMonitor selects %d Services, want 1", scraped)
			}
		})
	}
}

// selects reports whether labels match every label of selector.
func selects(selector map[string]any, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}
