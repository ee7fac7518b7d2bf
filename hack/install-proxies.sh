#!/usr/bin/env bash
# Installs the reverse proxies `make bench-proxy` compares the gateway with:
# nginx (Debian's nginx-light) and haproxy, from Debian's packages. No service
# is enabled or started: the benchmark runs its own instances with the
# configurations in hack/bench-proxy/.
#
# Idempotent: when both are installed it returns in well under a second without
# touching apt. Prints nothing on success; the benchmark measures whichever of
# the two it finds, so a failure here only leaves that proxy out.
set -euo pipefail

packages=(nginx-light haproxy)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-proxies: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi

echo "install-proxies: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# Where systemd runs, Debian's packaging would start both services; the
# benchmark starts its own, so keep the packages from starting any.
$sudo env RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
