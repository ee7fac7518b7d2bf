#!/usr/bin/env bash
# Installs the system packages kvgate builds and tests against: libzmq (cgo,
# for github.com/pebbe/zmq4), pkg-config, redis-server and etcd (tests start
# their own instances on loopback; no service is enabled).
#
# Idempotent: when every package is already installed it returns in well
# under a second without touching apt.
set -euo pipefail

packages=(libzmq3-dev pkg-config redis-server etcd-server)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# Debian's packaging would start services where systemd runs; tests start their
# own servers, so keep the packages from starting any.
$sudo env RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
