#!/usr/bin/env bash
# Makes the virtual environments the hub tests serve environments from (tests/helpers/openenv_*.py):
# one venv per hub package and version, apart from .venv, whose pinned dependencies a hub
# package may conflict with (openenv 0.10.0 would downgrade mcp and pillow there). agentrl's
# hub adapters never import these packages; they speak the hubs' wire protocols.
#
# Each venv is <root>/<name>, root = $AGENTRL_HUB_VENVS or ~/.cache/agentrl/hub-venvs, made
# with $AGENTRL_HUB_PYTHON (default python3). A stamp file (<venv>/.agentrl-stamp) holds the
# requirements it was made with: a venv whose stamp matches is left as it is (a re-run takes
# well under a second), any other is made anew. Arguments: the names to make (default: all).
set -euo pipefail
ROOT=${AGENTRL_HUB_VENVS:-$HOME/.cache/agentrl/hub-venvs}
PY=${AGENTRL_HUB_PYTHON:-python3}

# name | requirements (pip arguments)
VENVS=(
  "openenv-0.10.0|openenv==0.10.0"
  "verifiers-0.4.0|verifiers==0.4.0"
  "verifiers-0.3.1|verifiers==0.3.1"
)

make_venv() {
  local name=$1 reqs=$2 dir=$ROOT/$1
  local stamp=$dir/.agentrl-stamp
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$reqs" ] && [ -x "$dir/bin/python" ]; then
    return 0
  fi
  echo "scripts/hub_venvs.sh: making $dir ($reqs)" >&2
  rm -rf "$dir"
  mkdir -p "$ROOT"
  "$PY" -m venv "$dir"
  # shellcheck disable=SC2086  # the requirements are pip arguments, split on spaces
  if ! "$dir/bin/python" -m pip install -q $reqs; then
    rm -rf "$dir"
    echo "scripts/hub_venvs.sh: pip install $reqs failed for $dir" >&2
    return 1
  fi
  printf '%s' "$reqs" > "$stamp"
}

want=("$@")
for entry in "${VENVS[@]}"; do
  name=${entry%%|*}
  reqs=${entry#*|}
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $name "* ]]; then
    continue
  fi
  make_venv "$name" "$reqs"
done
