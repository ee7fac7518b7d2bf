package config

import (
	"net"
	"time"
)

// SectionExtProc is the configuration reference's section on serving
// kvgate's routing to Envoy as an external processor.
const SectionExtProc = "Envoy external processing"

// Envoy external processing.
var (
	ExtProcListenAddress = Var{
		Name:    "KVGATE_EXTPROC_LISTEN_ADDRESS",
		Default: "",
		Section: SectionExtProc,
		Doc: "When set (host:port, e.g. :9002), the gateway also serves Envoy's external processing API " +
			"(envoy.service.ext_proc.v3) there, as the endpoint picker of an InferencePool or in place of AIBrix's " +
			"gateway plugin: Envoy sends each request's headers and body, kvgate answers with the pod in the " +
			"x-gateway-destination-endpoint and target-pod headers and the envoy.lb metadata. See docs/envoy.md.",
		Flag: "extproc-listen-address",
	}
	ExtProcFailOpen = Var{
		Name:    "KVGATE_EXTPROC_FAIL_OPEN",
		Default: "false",
		Section: SectionExtProc,
		Doc: "When no pod can be picked for a request (the gateway is not ready, no pod of its model is ready, none " +
			"is in the proxy's subset), let it continue without an endpoint for Envoy to route, instead of " +
			"answering 503. Client errors (400, 404, 413) are answered either way.",
	}
	ExtProcTLS = Var{
		Name:    "KVGATE_EXTPROC_TLS",
		Default: "true",
		Section: SectionExtProc,
		Doc: "Serve external processing over TLS, as Gateway API implementations expect of an endpoint picker " +
			"(they do not verify its certificate), with the certificate of KVGATE_EXTPROC_CERT_DIR or, without " +
			"one, a certificate kvgate signs itself at start; false serves plaintext gRPC.",
	}
	ExtProcCertDir = Var{
		Name:    "KVGATE_EXTPROC_CERT_DIR",
		Default: "",
		Section: SectionExtProc,
		Doc: "Directory holding tls.crt and tls.key (a mounted kubernetes.io/tls Secret) for external processing " +
			"over TLS; a renewed pair is served without a restart.",
	}
	ExtProcMaxStreams = Var{
		Name:    "KVGATE_EXTPROC_MAX_STREAMS",
		Default: "4096",
		Section: SectionExtProc,
		Doc: "Most external processing streams (one per request Envoy has in flight) served at once over all " +
			"connections, and on one connection (gRPC's MAX_CONCURRENT_STREAMS, so that Envoy opens another " +
			"connection or waits); a stream beyond it is refused with gRPC status RESOURCE_EXHAUSTED, on which " +
			"Envoy applies the filter's failure_mode_allow. A stream costs a goroutine and its state, and the " +
			"message gRPC is receiving for it: at most KVGATE_MAX_REQUEST_BODY_BYTES + 1 MiB, charged to " +
			"KVGATE_MAX_HELD_REQUEST_BYTES only once received. At least 1.",
		Flag: "extproc-max-streams",
	}
	ExtProcMaxConnections = Var{
		Name:    "KVGATE_EXTPROC_MAX_CONNECTIONS",
		Default: "1024",
		Section: SectionExtProc,
		Doc: "Most connections the external processing listener holds open; at the bound it accepts none until one " +
			"closes, new ones waiting in the kernel's listen backlog. An idle connection costs about 100 KB (TLS and " +
			"HTTP/2 buffers, goroutines); Envoy carries many streams on each of a few connections per worker. At " +
			"least 1.",
		Flag: "extproc-max-connections",
	}
	ExtProcMaxMessageTimeout = Var{
		Name:    "KVGATE_EXTPROC_MAX_MESSAGE_TIMEOUT",
		Default: "0",
		Section: SectionExtProc,
		Doc: "The ext_proc filter's max_message_timeout in Envoy, in seconds or with a unit (\"70s\"). When above 0, a " +
			"request that waits in its model's SLO queue asks Envoy (override_message_timeout) to wait for its answer " +
			"until it leaves the queue, at most this long, rather than message_timeout. Envoy ignores an override " +
			"beyond its max_message_timeout, or any without one: set both. 0 never asks.",
		Flag: "extproc-max-message-timeout",
	}
	ProxyEnabled = Var{
		Name:    "KVGATE_PROXY_ENABLED",
		Default: "true",
		Section: SectionExtProc,
		Doc: "Serve the OpenAI API (the HTTP proxy) on KVGATE_LISTEN_ADDRESS. false leaves Envoy the only way in: " +
			"the listener then serves /healthz, /readyz, /metrics and /debug alone. Needs KVGATE_EXTPROC_LISTEN_ADDRESS.",
		Flag: "proxy-enabled",
	}
)

// ExtProc is the configuration of the external processing server.
type ExtProc struct {
	// ListenAddress is where it serves, "" for nowhere.
	ListenAddress string
	// FailOpen, TLS, CertDir, MaxStreams, MaxConnections and
	// MaxMessageTimeout are ExtProcFailOpen, ExtProcTLS, ExtProcCertDir,
	// ExtProcMaxStreams, ExtProcMaxConnections and ExtProcMaxMessageTimeout.
	FailOpen          bool
	TLS               bool
	CertDir           string
	MaxStreams        int
	MaxConnections    int
	MaxMessageTimeout time.Duration
}

// LoadExtProc reads the external processing settings from e, recording a
// malformed address, a stream bound below 1 and a certificate directory
// without TLS in e.
func LoadExtProc(e *Env) ExtProc {
	x := ExtProc{
		ListenAddress:     e.String(ExtProcListenAddress),
		FailOpen:          e.Bool(ExtProcFailOpen),
		TLS:               e.Bool(ExtProcTLS),
		CertDir:           e.String(ExtProcCertDir),
		MaxStreams:        e.Int(ExtProcMaxStreams, 1),
		MaxConnections:    e.Int(ExtProcMaxConnections, 1),
		MaxMessageTimeout: e.DurationOrZero(ExtProcMaxMessageTimeout, time.Second),
	}
	if x.ListenAddress != "" {
		if _, _, err := net.SplitHostPort(x.ListenAddress); err != nil {
			e.Errorf("%s=%q: want host:port, e.g. :9002: %v", ExtProcListenAddress.Name, x.ListenAddress, err)
		}
	}
	if x.CertDir != "" && !x.TLS {
		e.Errorf("%s is set but %s is false: the certificate would not be served", ExtProcCertDir.Name, ExtProcTLS.Name)
	}
	if !e.Bool(ProxyEnabled) && x.ListenAddress == "" {
		e.Errorf("%s is false and %s is unset: the gateway would take no requests", ProxyEnabled.Name, ExtProcListenAddress.Name)
	}
	return x
}
