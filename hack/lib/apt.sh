# apt_install NAME PACKAGE... installs the Debian packages that are missing,
# as root or through sudo, and returns at once when none is. NAME prefixes
# its messages. Debian's packaging would start services where systemd runs;
# kvgate's tests and benchmarks start their own servers, so no package may
# start one.
apt_install() {
  local name=$1
  shift
  local missing=() p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0

  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "$name: need root or sudo to install: ${missing[*]}" >&2; return 1; }
    sudo="sudo"
  fi

  echo "$name: installing ${missing[*]}" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
