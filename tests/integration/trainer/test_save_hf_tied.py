"""``PolicyTrainer.save_hf`` as the export uses it, on tiny random Llamas (no run needed):
tied weights once and tied again, untied ones both kept, shards with an index above
``max_shard_size``, and a ``config.json`` for users (``use_cache`` back on). The whole
command on a real run is ``tests/integration/cluster/test_export.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from agentrl.trainer import PolicyTrainer, TrainerConfig
from agentrl.trainer.export import load_hf_folder, untied_pairs
from tests.helpers.trainer import make_batch, make_tiny_llama

pytestmark = pytest.mark.usefixtures("process_group")


def _stored_keys(folder: Path) -> list[str]:
    keys: list[str] = []
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            keys += list(h.keys())
    return keys


@pytest.mark.parametrize("tied", [True, False])
def test_save_hf_stores_a_tied_matrix_once_in_shards_and_reloads_it_tied(tmp_path: Path, tied: bool) -> None:
    src = make_tiny_llama(tmp_path / "src", seed=3, tie_word_embeddings=tied)
    trainer = PolicyTrainer(TrainerConfig(model_path=src, lr=1e-3))
    trainer.step(make_batch(num_rows=3, seed=4))  # weights away from the source folder's
    out = tmp_path / "out"
    trainer.save_hf(out, max_shard_size=40_000)  # bytes; the 256 x 64 fp32 embedding alone is 65,536

    keys = _stored_keys(out)
    assert len(keys) == len(set(keys))
    assert ("lm_head.weight" in keys) == (not tied) and "model.embed_tokens.weight" in keys
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and shards[0].startswith("model-00001-of-")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == sorted(keys)

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["use_cache"] is True and cfg["dtype"] == "float32" and cfg["tie_word_embeddings"] is tied
    model = load_hf_folder(out)
    assert untied_pairs(model) == []
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    want = trainer.full_state_dict()  # the weight sync's dict: still both names
    assert "lm_head.weight" in want
    got = model.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_save_hf_in_bf16_says_so_in_config(tmp_path: Path) -> None:
    src = make_tiny_llama(tmp_path / "src", seed=5, tie_word_embeddings=True)
    trainer = PolicyTrainer(TrainerConfig(model_path=src))
    trainer.save_hf(tmp_path / "out", torch.bfloat16)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as h:
        assert {h.get_tensor(k).dtype for k in h.keys()} == {torch.bfloat16}
        assert "lm_head.weight" not in set(h.keys())
