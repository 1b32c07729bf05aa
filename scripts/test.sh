#!/usr/bin/env bash
# Runs the test suite (after scripts/install.sh). Extra arguments go to pytest (one pytest
# process); without any, the whole suite runs as two pytest processes side by side (the cluster
# tests, and the rest: below). pytest's exit code 5 (no tests collected) is a failure here,
# never a silent pass.
#
# Docker: starts dockerd when none answers (and stops it again at the end), builds the
# sandbox base image once (cached by recipe in Docker's own storage), and makes the
# `docker`-marked tests fail rather than skip if the daemon is missing. Set
# AGENTRL_TEST_DOCKER=0 to run without Docker (those tests are then skipped).
#
# PostgreSQL: starts a throw-away server (as the `postgres` user, in a temporary directory:
# tests/helpers/postgres_ctl.py), exports its admin URL as AGENTRL_TEST_POSTGRES_URL (each
# test module makes a database of its own on it) and stops it at the end; the
# `postgres`-marked tests then fail rather than skip without it. Set AGENTRL_TEST_POSTGRES=0
# to run without it (those tests are then skipped).
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
PY=.venv/bin/python
CTL=tests/integration/sandboxes/dockerd_ctl.py
PG_CTL=tests/helpers/postgres_ctl.py
cleanup=()  # commands run at exit, last started first
on_exit() { local i; for ((i=${#cleanup[@]}-1; i>=0; i--)); do ${cleanup[i]} >/dev/null 2>&1; done; }
trap on_exit EXIT

# Test-only system packages (Debian's Chromium for the viewer's browser tests): install.sh
# installs them when asked (a re-run with nothing to install takes about a second). The
# browser tests then fail rather than skip when no browser starts.
AGENTRL_INSTALL_TEST_DEPS=1 bash scripts/install.sh >/dev/null \
  || { echo "scripts/test.sh: installing the test dependencies failed (scripts/install.sh)" >&2; exit 1; }
export AGENTRL_REQUIRE_BROWSER=1
# The hub tests' servers run from virtual environments of their own (a hub package may conflict
# with .venv's pins): made once, cached under ~/.cache/agentrl/hub-venvs (scripts/hub_venvs.sh).
# Made in the background (about 3 min the first time, mostly downloads) while the suite starts;
# a hub test waits for it (AGENTRL_HUB_VENVS_PID, tests/helpers/openenv_hub.py) and fails
# without its venv. A failed making fails this script whatever pytest says.
hub_log=$(mktemp /tmp/agentrl-hub-venvs.XXXXXX.log)
bash scripts/hub_venvs.sh >"$hub_log" 2>&1 &
hub_pid=$!
cleanup+=("rm -f $hub_log")
export AGENTRL_HUB_VENVS_PID=$hub_pid AGENTRL_REQUIRE_HUB_VENVS=1

if [ "${AGENTRL_TEST_DOCKER:-1}" = 1 ]; then
  if ! command -v dockerd >/dev/null 2>&1 && [ ! -x /usr/sbin/dockerd ]; then
    echo "scripts/test.sh: dockerd missing; run scripts/install.sh first" >&2
    exit 1
  fi
  started=$($PY "$CTL" start) || { echo "scripts/test.sh: could not start dockerd" >&2; exit 1; }
  if [ "$started" = started ]; then
    cleanup+=("$PY $CTL stop")
  elif ! $PY -c "import sys; from sandboxes.docker.daemon import agentrl_daemon; sys.exit(agentrl_daemon() is None)"; then
    # A daemon this script did not start answers: name it, so the tests' sandbox.backend: auto
    # uses it (auto never takes an unnamed daemon it did not start: docs/sandboxes.md).
    export DOCKER_HOST=${DOCKER_HOST:-unix:///var/run/docker.sock}
  fi
  $PY -c "from sandboxes.docker.images import build_image; build_image(progress=lambda m: print('[test] ' + m))" \
    || { echo "scripts/test.sh: building the sandbox base image failed" >&2; exit 1; }
  export AGENTRL_REQUIRE_DOCKER=1
fi

if [ "${AGENTRL_TEST_POSTGRES:-1}" = 1 ]; then
  pg_state_dir=$(mktemp -d /tmp/agentrl-test-pg.XXXXXX)
  export AGENTRL_TEST_POSTGRES_STATE=$pg_state_dir/state.json
  cleanup+=("rm -rf $pg_state_dir" "$PY $PG_CTL stop")
  AGENTRL_TEST_POSTGRES_URL=$($PY "$PG_CTL" start) \
    || { echo "scripts/test.sh: could not start PostgreSQL (tests/helpers/postgres_ctl.py)" >&2; exit 1; }
  export AGENTRL_TEST_POSTGRES_URL AGENTRL_REQUIRE_POSTGRES=1
fi

PYTEST=($PY -m pytest -q -p no:cacheprovider --durations=40)
if [ $# -gt 0 ]; then
  "${PYTEST[@]}" "$@"
  rc=$?
else
  # The whole suite as two pytest processes at once: the cluster tests (Ray instances and
  # training runs, which mostly wait on subprocesses and actors) and the rest (mostly CPU).
  # One after the other they took 40 min on 2 cores; side by side the wall time is about the
  # longer of the two. They share the daemons started above; tests that look at what a crash
  # left hold the reaper lock (sandboxes.reaper.reaper_lock) so that a run starting in the
  # other process does not reap it first. The rest's output follows the cluster tests' own.
  rest_log=$(mktemp /tmp/agentrl-test-rest.XXXXXX.log)
  cleanup+=("rm -f $rest_log")
  # Session fixtures both parts use (the viewer's real training runs) are built once, by the
  # part that asks first, in this folder (tests/helpers/built_once.py).
  AGENTRL_TEST_SHARED_DIR=$(mktemp -d /tmp/agentrl-test-shared.XXXXXX)
  export AGENTRL_TEST_SHARED_DIR
  cleanup+=("rm -rf $AGENTRL_TEST_SHARED_DIR")
  # The rest runs in a session of its own (a Ctrl-C at the terminal reaches the cluster part
  # only), and gets one SIGINT from the trap: both parts stop as pytest stops, with teardown.
  setsid "${PYTEST[@]}" tests --ignore=tests/integration/cluster >"$rest_log" 2>&1 &
  rest_pid=$!
  cleanup+=("kill $rest_pid")
  trap 'kill -INT "$rest_pid" 2>/dev/null' INT
  echo "== tests/integration/cluster (the rest of the suite runs beside it; its output follows) =="
  "${PYTEST[@]}" tests/integration/cluster
  rc_cluster=$?
  while :; do
    wait "$rest_pid"
    rc_rest=$?
    [ $rc_rest -le 128 ] && break             # it ended with a status
    kill -0 "$rest_pid" 2>/dev/null || break  # it was killed by a signal (else: the trap ran; wait again)
  done
  trap - INT
  unset 'cleanup[${#cleanup[@]}-1]'  # its kill: the pid is reaped now
  echo "== tests, less tests/integration/cluster =="
  cat "$rest_log"
  rc=0
  for part in "cluster:$rc_cluster" "rest:$rc_rest"; do
    code=${part#*:}
    if [ "$code" -eq 5 ]; then
      echo "scripts/test.sh: pytest collected no tests in the ${part%%:*} part; that is a failure" >&2
      rc=1
    elif [ "$code" -ne 0 ]; then
      rc=$code
    fi
  done
fi
if ! wait "$hub_pid"; then
  echo "scripts/test.sh: making the hub venvs failed (scripts/hub_venvs.sh):" >&2
  tail -20 "$hub_log" >&2
  [ $rc -eq 0 ] && rc=1
fi
if [ $rc -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit $rc
