package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// urlTemplate is AIBRIX_VLLM_TOKENIZER_ENDPOINT_TEMPLATE, a pod's vLLM
// server URL with %s standing for the pod's IP, e.g. http://%s:8000.
//
// Pods do not all serve on the template's port: static endpoints share an
// IP and differ by port, and Kubernetes pods may declare theirs with
// endpoint.ModelPortLabel. So the template's port is the default, and a pod's
// declared serving port replaces it: for a pod at 10.0.0.5 declaring port
// 8100, http://%s:8000 gives http://10.0.0.5:8100. A template without a port
// defaults to its scheme's (80 or 443).
type urlTemplate struct {
	scheme string
	port   int
	// path is the template's path after the host, usually empty.
	path string
}

// placeholderIP stands for the pod's IP while a template is parsed.
const placeholderIP = "192.0.2.1"

// parseTokenizerTemplate parses a tokenizer endpoint template: an http or
// https URL whose host is %s, with an optional port and path, and no query.
func parseTokenizerTemplate(template string) (urlTemplate, error) {
	if strings.Count(template, "%s") != 1 {
		return urlTemplate{}, errors.New("want a URL with one %s standing for the pod's IP, e.g. http://%s:8000")
	}
	u, err := url.Parse(strings.Replace(template, "%s", placeholderIP, 1))
	if err != nil {
		return urlTemplate{}, fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return urlTemplate{}, fmt.Errorf("scheme %q: want http or https", u.Scheme)
	}
	if u.Hostname() != placeholderIP || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return urlTemplate{}, errors.New("want %s as the whole host, and no user, query or fragment")
	}
	t := urlTemplate{scheme: u.Scheme, path: strings.TrimSuffix(u.EscapedPath(), "/"), port: 80}
	if u.Scheme == "https" {
		t.port = 443
	}
	if p := u.Port(); p != "" {
		if t.port, err = strconv.Atoi(p); err != nil || t.port < 1 || t.port > 65535 {
			return urlTemplate{}, fmt.Errorf("port %q is not a port", p)
		}
	}
	return t, nil
}

// forPod returns the base URL of the pod's vLLM server: the pod's IP and
// its declared serving port, the template's port when it declares none.
func (t urlTemplate) forPod(pod *endpoint.Endpoint) string {
	return t.scheme + "://" + net.JoinHostPort(pod.IP, strconv.Itoa(cmp.Or(pod.DeclaredPort, t.port))) + t.path
}
