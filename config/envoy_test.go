package manifests

import (
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/extproc"
	"github.com/kvgate/kvgate/pkg/gateway"
)

// envoyConfig is the plain Envoy configuration kvgate ships.
const envoyConfig = "envoy/envoy.yaml"

// TestEnvoyConfigurationRoutesThroughKvgate reads config/envoy/envoy.yaml as
// Envoy does (its v3 bootstrap, every typed config resolved, validated by
// the API's rules) and checks that it makes kvgate the picker: the ext_proc
// filter sends kvgate's server the body in a mode kvgate can pick in and
// the response in pieces, accepts the envoy.lb metadata, reports why Envoy
// answered itself, waits longer than kvgate's tokenizer may take, and fails
// closed; the route's cluster sends each request to the endpoint kvgate
// names; requests as large as kvgate accepts are buffered.
func TestEnvoyConfigurationRoutesThroughKvgate(t *testing.T) {
	text, err := os.ReadFile(envoyConfig)
	if err != nil {
		t.Fatal(err)
	}
	data, err := yaml.YAMLToJSON(text)
	if err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(data, b); err != nil {
		t.Fatalf("%s is not an Envoy v3 bootstrap: %v", envoyConfig, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s breaks Envoy's API rules: %v", envoyConfig, err)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	listeners := b.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("%d listeners, want 1", len(listeners))
	}
	l := listeners[0]
	if limit := l.GetPerConnectionBufferLimitBytes().GetValue(); int64(limit) < gateway.DefaultMaxRequestBodyBytes {
		t.Errorf("per_connection_buffer_limit_bytes %d: Envoy would refuse bodies kvgate accepts (%d bytes)", limit,
			gateway.DefaultMaxRequestBodyBytes)
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	filters := hcm.GetHttpFilters()
	if len(filters) != 2 || filters[1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("http filters %v: want ext_proc then the router", filters)
	}
	ep := &extprocfilterv3.ExternalProcessor{}
	if err := filters[0].GetTypedConfig().UnmarshalTo(ep); err != nil {
		t.Fatalf("the first filter is not ext_proc: %v", err)
	}

	mode := ep.GetProcessingMode()
	picks := mode.GetRequestBodyMode() == extprocfilterv3.ProcessingMode_BUFFERED ||
		mode.GetRequestBodyMode() == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
		(mode.GetRequestBodyMode() == extprocfilterv3.ProcessingMode_STREAMED && ep.GetSendBodyWithoutWaitingForHeaderResponse())
	if !picks || mode.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_NONE ||
		mode.GetRequestHeaderMode() == extprocfilterv3.ProcessingMode_SKIP || mode.GetResponseHeaderMode() == extprocfilterv3.ProcessingMode_SKIP {
		t.Errorf("processing mode %v: kvgate needs the request's headers and body before Envoy picks a host, and the response", mode)
	}
	if ep.GetFailureModeAllow() {
		t.Errorf("failure_mode_allow: without kvgate's endpoint the original-destination cluster has no host")
	}
	if !slices.Contains(ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(), extproc.MetadataNamespace) {
		t.Errorf("the filter does not accept kvgate's %s metadata", extproc.MetadataNamespace)
	}
	if !slices.Contains(ep.GetResponseAttributes(), extproc.AttributeCodeDetails) {
		t.Errorf("response_attributes lacks %s: kvgate could not eject a pod Envoy fails to reach", extproc.AttributeCodeDetails)
	}
	tokenizer, err := strconv.Atoi(config.TokenizerRequestTimeout.Default)
	if err != nil {
		t.Fatal(err)
	}
	if got := ep.GetMessageTimeout().AsDuration(); got <= time.Duration(tokenizer)*time.Second {
		t.Errorf("message_timeout %v: a request whose tokenization takes up to %d s would fail", got, tokenizer)
	}
	maxWait, err := strconv.Atoi(config.SLOQueueMaxWait.Default)
	if err != nil {
		t.Fatal(err)
	}
	if got := ep.GetMaxMessageTimeout().AsDuration(); got <= time.Duration(maxWait)*time.Second {
		t.Errorf("max_message_timeout %v: a request waiting up to %d s in an SLO queue could not extend message_timeout", got, maxWait)
	}

	kvgate := clusters[ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()]
	if kvgate == nil {
		t.Fatalf("no cluster %q for kvgate", ep.GetGrpcService().GetEnvoyGrpc().GetClusterName())
	}
	proto := &upstreamhttpv3.HttpProtocolOptions{}
	if opts := kvgate.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; opts == nil ||
		opts.UnmarshalTo(proto) != nil || proto.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("cluster %s does not speak HTTP/2, which gRPC needs", kvgate.GetName())
	}
	if kvgate.GetTransportSocket().GetName() != "envoy.transport_sockets.tls" {
		t.Errorf("cluster %s is plaintext; kvgate serves TLS by default (%s)", kvgate.GetName(), config.ExtProcTLS.Name)
	}

	route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0].GetRoute()
	engines := clusters[route.GetCluster()]
	if engines == nil {
		t.Fatalf("no cluster %q for the route", route.GetCluster())
	}
	dst := engines.GetOriginalDstLbConfig()
	if engines.GetType() != clusterv3.Cluster_ORIGINAL_DST || engines.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED ||
		!dst.GetUseHttpHeader() || dst.GetHttpHeaderName() != extproc.HeaderDestination {
		t.Errorf("cluster %s does not send requests to the %s kvgate names: %v", engines.GetName(), extproc.HeaderDestination, engines)
	}
}
