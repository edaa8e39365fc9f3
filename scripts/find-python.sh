#!/usr/bin/env bash
# Print the path of a Python interpreter of the wanted version (default 3.12): PATH, then pyenv.
set -euo pipefail
want=${1:-3.12}
for cand in "python$want" python3 python; do
  if bin=$(command -v "$cand" 2>/dev/null) && "$bin" -c "import sys; sys.exit(0 if '%d.%d' % sys.version_info[:2] == '$want' else 1)" 2>/dev/null; then
    echo "$bin"; exit 0
  fi
done
for root in "${PYENV_ROOT:-$HOME/.pyenv}" /root/.pyenv /usr/local/pyenv; do
  for bin in "$root"/versions/"$want"*/bin/python"$want"; do
    [ -x "$bin" ] && { echo "$bin"; exit 0; }
  done
done
echo "no Python $want found: install it (e.g. 'pyenv install $want') and run make setup again" >&2
exit 1
