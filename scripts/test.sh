#!/usr/bin/env bash
# Runs the test suite (after scripts/install.sh). Extra arguments go to pytest.
# pytest's exit code 5 (no tests collected) is a failure here, never a silent pass.
#
# Docker: starts dockerd when none answers (and stops it again at the end), builds the
# sandbox base image once (cached by recipe in Docker's own storage), and makes the
# `docker`-marked tests fail rather than skip if the daemon is missing. Set
# AGENTRL_TEST_DOCKER=0 to run without Docker (those tests are then skipped).
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
PY=.venv/bin/python
CTL=tests/integration/sandboxes/dockerd_ctl.py

# Test-only system packages (Debian's Chromium for the viewer's browser tests): install.sh
# installs them when asked (a re-run with nothing to install takes about a second). The
# browser tests then fail rather than skip when no browser starts.
AGENTRL_INSTALL_TEST_DEPS=1 bash scripts/install.sh >/dev/null \
  || { echo "scripts/test.sh: installing the test dependencies failed (scripts/install.sh)" >&2; exit 1; }
export AGENTRL_REQUIRE_BROWSER=1

if [ "${AGENTRL_TEST_DOCKER:-1}" = 1 ]; then
  if ! command -v dockerd >/dev/null 2>&1 && [ ! -x /usr/sbin/dockerd ]; then
    echo "scripts/test.sh: dockerd missing; run scripts/install.sh first" >&2
    exit 1
  fi
  started=$($PY "$CTL" start) || { echo "scripts/test.sh: could not start dockerd" >&2; exit 1; }
  if [ "$started" = started ]; then
    trap '$PY "$CTL" stop >/dev/null' EXIT
  fi
  $PY -c "from sandboxes.docker.images import build_image; build_image(progress=lambda m: print('[test] ' + m))" \
    || { echo "scripts/test.sh: building the sandbox base image failed" >&2; exit 1; }
  export AGENTRL_REQUIRE_DOCKER=1
fi

$PY -m pytest -q -p no:cacheprovider --durations=25 "${@:-tests}"
rc=$?
if [ $rc -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit $rc
