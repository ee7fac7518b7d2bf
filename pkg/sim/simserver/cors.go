package simserver

import (
	"net/http"
	"slices"
	"strings"
)

// CORS is a cross-origin resource sharing policy, as vLLM's
// --allowed-origins, --allowed-methods, --allowed-headers and
// --allow-credentials configure the CORS middleware of its API server
// (Starlette's). A list holding "*" allows everything of its kind; an
// empty list allows nothing (but the CORS-safelisted headers).
type CORS struct {
	AllowedOrigins   []string
	AllowedMethods   []string
	AllowedHeaders   []string
	AllowCredentials bool
}

// DefaultCORS returns vLLM's default policy: every origin, method and
// header allowed, credentials not.
func DefaultCORS() CORS {
	return CORS{AllowedOrigins: []string{"*"}, AllowedMethods: []string{"*"}, AllowedHeaders: []string{"*"}}
}

// corsMaxAge is the Access-Control-Max-Age of every allowed preflight, in
// seconds: Starlette's default, which vLLM does not change.
const corsMaxAge = "600"

// corsAllMethods are the methods "*" stands for in AllowedMethods.
var corsAllMethods = []string{"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"}

// corsSafelisted are the request headers always allowed.
var corsSafelisted = []string{"Accept", "Accept-Language", "Content-Language", "Content-Type"}

// corsPolicy is a CORS policy ready to answer with.
type corsPolicy struct {
	allOrigins, allHeaders, credentials bool
	origins                             []string
	methods                             []string
	// headers are the allowed request headers, lower case, the
	// safelisted ones among them.
	headers []string
	// explicitOrigin is set when an allowed preflight names its origin
	// in Access-Control-Allow-Origin, rather than "*".
	explicitOrigin bool
	allowMethods   string // the Access-Control-Allow-Methods value
	allowHeaders   string // the Access-Control-Allow-Headers value, "" for none
}

func newCORSPolicy(c CORS) *corsPolicy {
	p := &corsPolicy{
		allOrigins:  slices.Contains(c.AllowedOrigins, "*"),
		allHeaders:  slices.Contains(c.AllowedHeaders, "*"),
		credentials: c.AllowCredentials,
		origins:     slices.Clone(c.AllowedOrigins),
		methods:     slices.Clone(c.AllowedMethods),
	}
	if slices.Contains(p.methods, "*") {
		p.methods = corsAllMethods
	}
	p.explicitOrigin = !p.allOrigins || p.credentials
	p.allowMethods = strings.Join(p.methods, ", ")
	names := slices.Concat(corsSafelisted, c.AllowedHeaders)
	slices.Sort(names)
	names = slices.Compact(names)
	if !p.allHeaders {
		p.allowHeaders = strings.Join(names, ", ")
	}
	for _, n := range names {
		p.headers = append(p.headers, strings.ToLower(n))
	}
	return p
}

// withCORS returns next behind vLLM's CORS middleware with policy c: a
// preflight (OPTIONS with Origin and Access-Control-Request-Method), to
// any path, is answered by the policy alone, 200 "OK" when it allows the
// origin, the method and every requested header, else 400 "Disallowed
// CORS" and what it refused; any other request with Origin is served by
// next, its response marked with Access-Control-Allow-Origin when the
// policy allows the origin.
func withCORS(next http.Handler, c CORS) http.Handler {
	p := newCORSPolicy(c)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin, ok := r.Header["Origin"]
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		if _, preflight := r.Header["Access-Control-Request-Method"]; preflight && r.Method == http.MethodOptions {
			p.preflight(w, r)
			return
		}
		_, cookie := r.Header["Cookie"]
		p.mark(w.Header(), first(origin), cookie)
		next.ServeHTTP(w, r)
	})
}

// first returns vs' first value, "" for none.
func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

func (p *corsPolicy) allowsOrigin(origin string) bool {
	return p.allOrigins || slices.Contains(p.origins, origin)
}

// preflight answers a preflight.
func (p *corsPolicy) preflight(w http.ResponseWriter, r *http.Request) {
	origin := r.Header.Get("Origin")
	h := w.Header()
	if p.explicitOrigin {
		h.Set("Vary", "Origin")
	} else {
		h.Set("Access-Control-Allow-Origin", "*")
	}
	h.Set("Access-Control-Allow-Methods", p.allowMethods)
	h.Set("Access-Control-Max-Age", corsMaxAge)
	if p.allowHeaders != "" {
		h.Set("Access-Control-Allow-Headers", p.allowHeaders)
	}
	if p.credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
	var refused []string
	if p.allowsOrigin(origin) {
		if p.explicitOrigin {
			h.Set("Access-Control-Allow-Origin", origin)
		}
	} else {
		refused = append(refused, "origin")
	}
	if !slices.Contains(p.methods, r.Header.Get("Access-Control-Request-Method")) {
		refused = append(refused, "method")
	}
	if requested, ok := r.Header["Access-Control-Request-Headers"]; ok {
		value := first(requested)
		if p.allHeaders {
			h.Set("Access-Control-Allow-Headers", value)
		} else {
			for name := range strings.SplitSeq(value, ",") {
				if !slices.Contains(p.headers, strings.TrimSpace(strings.ToLower(name))) {
					refused = append(refused, "headers")
					break
				}
			}
		}
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	if len(refused) > 0 {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte("Disallowed CORS " + strings.Join(refused, ", ")))
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("OK"))
}

// mark sets the CORS headers of the response to a request from origin,
// which sent cookies when cookie is set.
func (p *corsPolicy) mark(h http.Header, origin string, cookie bool) {
	if p.allOrigins {
		h.Set("Access-Control-Allow-Origin", "*")
	}
	if p.credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
	// A request with cookies must be answered with its origin, never "*".
	if (p.allOrigins && cookie) || (!p.allOrigins && p.allowsOrigin(origin)) {
		h.Set("Access-Control-Allow-Origin", origin)
		h.Add("Vary", "Origin")
	}
}
