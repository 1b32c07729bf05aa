"""The cluster commands of docs/cluster.md ("Running on a Ray cluster", steps 1-4) work as written:
``scripts/cluster_check.sh`` runs them on this machine (four ``ray start`` nodes, both
launches with the tiny model for one iteration and an env module only the launching shell
can import, then ``ray stop``), inside its own pid, mount and network namespaces, each worker
node with a ``/tmp/ray`` of its own as on a machine of its own (nodes sharing one lose a ``ray
job submit`` driver's working directory: Ray unpacks the job's ``working_dir`` again for each
node)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]


def test_docs_cluster_commands_work_as_written(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("scripts/cluster_check.sh needs root, unshare and ip (namespaces of its own)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", "RAY_AUTH_MODE")}
    logs = tmp_path / "logs"  # the head node's Ray logs (job driver, runtime env setup) and the runs
    env["AGENTRL_CLUSTER_CHECK_LOGS"] = str(logs)
    proc = subprocess.run(["bash", "scripts/cluster_check.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{out[-6000:]}\n(Ray's logs and the runs: {logs})"
    assert "ok: the cluster commands of docs/cluster.md work as written" in out
