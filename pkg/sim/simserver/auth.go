package simserver

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// publicPaths are the paths answered without a key, as vLLM's public
// endpoints are.
var publicPaths = map[string]bool{"/health": true, "/metrics": true}

// requireAPIKey returns next behind vLLM's key check: a request for any
// path but publicPaths, other than an OPTIONS one, is answered 401 unless
// its Authorization header is "Bearer <key>" (the scheme in any case) with
// one of keys.
func requireAPIKey(next http.Handler, keys []string) http.Handler {
	digests := make([][sha256.Size]byte, len(keys))
	for i, k := range keys {
		digests[i] = sha256.Sum256([]byte(k))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions || publicPaths[r.URL.Path] || presentsKey(r.Header.Get("Authorization"), digests) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
	})
}

// presentsKey reports whether authorization is "Bearer <key>" with a key
// whose digest is among digests, comparing every digest in constant time.
func presentsKey(authorization string, digests [][sha256.Size]byte) bool {
	scheme, key, _ := strings.Cut(authorization, " ")
	if !strings.EqualFold(scheme, "bearer") {
		return false
	}
	d := sha256.Sum256([]byte(key))
	match := 0
	for _, want := range digests {
		match |= subtle.ConstantTimeCompare(d[:], want[:])
	}
	return match == 1
}
