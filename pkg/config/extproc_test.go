package config

import (
	"strings"
	"testing"
	"time"
)

func TestLoadExtProc(t *testing.T) {
	e := NewEnv(lookupFrom(nil))
	if x := LoadExtProc(e); e.Err() != nil || x != (ExtProc{TLS: true, MaxStreams: 4096, MaxConnections: 1024}) {
		t.Errorf("defaults: %+v, %v; want no server, TLS on", x, e.Err())
	}
	e = NewEnv(lookupFrom(map[string]string{"KVGATE_EXTPROC_LISTEN_ADDRESS": ":9002", "KVGATE_EXTPROC_FAIL_OPEN": "true",
		"KVGATE_EXTPROC_CERT_DIR": "/etc/kvgate/tls", "KVGATE_PROXY_ENABLED": "false", "KVGATE_EXTPROC_MAX_STREAMS": "64",
		"KVGATE_EXTPROC_MAX_MESSAGE_TIMEOUT": "70s", "KVGATE_EXTPROC_MAX_CONNECTIONS": "8"}))
	if x := LoadExtProc(e); e.Err() != nil || x != (ExtProc{ListenAddress: ":9002", FailOpen: true, TLS: true, CertDir: "/etc/kvgate/tls",
		MaxStreams: 64, MaxConnections: 8, MaxMessageTimeout: 70 * time.Second}) {
		t.Errorf("set: %+v, %v", x, e.Err())
	}
	e = NewEnv(lookupFrom(map[string]string{"KVGATE_EXTPROC_LISTEN_ADDRESS": "9002", "KVGATE_EXTPROC_TLS": "false",
		"KVGATE_EXTPROC_CERT_DIR": "/etc/kvgate/tls", "KVGATE_EXTPROC_MAX_STREAMS": "0",
		"KVGATE_EXTPROC_MAX_MESSAGE_TIMEOUT": "-1s", "KVGATE_EXTPROC_MAX_CONNECTIONS": "0"}))
	LoadExtProc(e)
	for _, want := range []string{`KVGATE_EXTPROC_LISTEN_ADDRESS="9002"`, "KVGATE_EXTPROC_CERT_DIR is set but KVGATE_EXTPROC_TLS is false",
		`KVGATE_EXTPROC_MAX_STREAMS="0": want an integer >= 1`, `KVGATE_EXTPROC_MAX_MESSAGE_TIMEOUT="-1s"`,
		`KVGATE_EXTPROC_MAX_CONNECTIONS="0": want an integer >= 1`} {
		if e.Err() == nil || !strings.Contains(e.Err().Error(), want) {
			t.Errorf("error %v, want one mentioning %s", e.Err(), want)
		}
	}
	e = NewEnv(lookupFrom(map[string]string{"KVGATE_PROXY_ENABLED": "false"}))
	if LoadExtProc(e); e.Err() == nil || !strings.Contains(e.Err().Error(), "would take no requests") {
		t.Errorf("proxy off without external processing: %v", e.Err())
	}
}
