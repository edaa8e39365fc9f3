#!/usr/bin/env bash
# The jailed interpreter runs as an unprivileged uid, and nsjail bind-mounts its paths from the
# host: every directory above the interpreter and the virtual environment must be traversable
# (o+x, not readable) by that uid. pyenv installs under /root (mode 0700), so open just the
# execute bit on each ancestor. Nothing is made readable that was not.
set -euo pipefail
py=${1:?usage: make-runtime-traversable.sh PYTHON}
paths=$("$py" -c 'import os, sys; print(os.path.realpath(sys.executable)); print(os.path.abspath(sys.prefix)); print(os.path.realpath(sys.base_prefix))')
while read -r p; do
  d=$p
  while [ "$d" != "/" ]; do
    d=$(dirname "$d")
    perms=$(stat -c '%A' "$d")
    [ "${perms:9:1}" = "x" ] || [ "${perms:9:1}" = "t" ] || chmod o+x "$d"
  done
done <<< "$paths"
