"""A user's own advantage estimator end to end: an advantage estimator registered from a user module, loaded through
``env.import_modules``, trains one real iteration (Ray, vLLM on CPU, FSDP2 trainer, HumanEval
in bubblewrap, the tiny model): ``algorithm.advantage: my_mean_baseline`` is what credit
calls, and the trained advantages are the ones it returned."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def test_a_user_estimator_trains_one_iteration(tmp_path, tiny_model_path, monkeypatch):
    import numpy as np

    from agentrl.driver.controller import train
    from test_train_loop import make_cfg

    # the module must import in every process that validates the config: the driver (here)
    # and the Ray actors, which inherit this PYTHONPATH when train() starts Ray
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    cfg = make_cfg(tmp_path, tiny_model_path, "custom-est", "env.import_modules=[my_estimator]",
                   "algorithm.advantage=my_mean_baseline")
    import my_estimator

    my_estimator.CALLS.clear()
    summary = train(cfg)
    assert summary.iterations_done == 1
    m = json.loads((tmp_path / "custom-est" / "metrics.jsonl").read_text().splitlines()[0])
    assert len(my_estimator.CALLS) == 1  # credit looked it up by name and called it once
    call = my_estimator.CALLS[0]
    assert call["values"] is None and len(call["group_ids"]) == len(call["rewards"]) > 0
    flat = np.concatenate([np.asarray(a, dtype=np.float64) for a in call["advantages"]])
    # what was trained on is what the estimator returned
    assert m["tokens/trained"] > 0 and summary.policy_version == 1
    assert m["advantages/mean"] == pytest.approx(float(flat.mean()), abs=1e-12)
    assert m["advantages/abs_max"] == pytest.approx(float(np.abs(flat).max()), abs=1e-12)
    assert m["advantages/nonzero_frac"] == pytest.approx(float((flat != 0).mean()), abs=1e-12)
    assert "actor/pg_loss" in m and not any(k.startswith("critic/") for k in m)
