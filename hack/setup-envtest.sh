#!/usr/bin/env bash
# Prepares a directory with the binaries controller-runtime's envtest needs
# (kube-apiserver and etcd) and prints its path, for KUBEBUILDER_ASSETS.
#
# Debian ships etcd (etcd-server, see install-deps.sh) but no kube-apiserver,
# so this builds kube-apiserver from the Go module proxy: a throwaway module
# requires k8s.io/kubernetes and replaces every staging module (k8s.io/api,
# client-go, ...) with its published version. The binary is cached under
# $KVGATE_CACHE_DIR (default ~/.cache/kvgate) and reused: the first build takes
# about 6 minutes on 2 cores, later calls return at once.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.37.1}"
cache="${KVGATE_CACHE_DIR:-$HOME/.cache/kvgate}"
assets="$cache/envtest/k8s-$K8S_VERSION"
apiserver="$assets/kube-apiserver"

etcd_bin="$(command -v etcd || true)"
if [ -z "$etcd_bin" ]; then
  echo "setup-envtest: etcd not found; run hack/install-deps.sh first" >&2
  exit 1
fi

mkdir -p "$assets"
ln -sf "$etcd_bin" "$assets/etcd"

if [ ! -x "$apiserver" ]; then
  echo "setup-envtest: building kube-apiserver v$K8S_VERSION (first time only, ~6 min)" >&2
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  cd "$work"
  staging_version="v0.${K8S_VERSION#1.}"
  gomod="$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module kvgate.local/kube-apiserver-build"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//; s/\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod"
    echo ")"
  } > go.mod
  minor="${K8S_VERSION#1.}"; minor="${minor%%.*}"
  ldflags="-s -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags="$ldflags" -o "$apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
  mv "$apiserver.tmp" "$apiserver"
fi

echo "$assets"
