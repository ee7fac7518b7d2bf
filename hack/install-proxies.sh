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

source "$(dirname "$0")/lib/apt.sh"
apt_install install-proxies nginx-light haproxy
