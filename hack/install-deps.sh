#!/usr/bin/env bash
# Installs the system packages kvgate builds and tests against: libzmq (cgo,
# for github.com/pebbe/zmq4), pkg-config, redis-server and etcd (tests start
# their own instances on loopback; no service is enabled).
#
# Idempotent: when every package is already installed it returns in well
# under a second without touching apt.
set -euo pipefail

source "$(dirname "$0")/lib/apt.sh"
apt_install install-deps libzmq3-dev pkg-config redis-server etcd-server
