"""``agentrl export``'s pure parts: the argument checks (run directory, checkpoint, OUT_DIR,
dtype) on hand-made run directories, the CLI's one-line errors for them, and the trainer-side
pieces of the export (tied copies dropped, config.json restored, the plain re-scoring) on
known values. The real round trip is ``tests/integration/cluster/test_export.py``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from agentrl.commands.export import (
    EXPORT_MARKER,
    _export_trainer_config,
    check_out_dir,
    export_config,
    is_export,
    prepare_export,
    resolve_checkpoint,
)
from agentrl.errors import CheckpointError, ConfigError, ContractError
from agentrl.trainer.export import drop_tied_copies, reference_log_probs, restore_user_config, untied_pairs


def _checkpoint(run: Path, name: str, *, controller: bool = True, complete: bool = True) -> Path:
    ckpt = run / "checkpoints" / name
    (ckpt / "trainer").mkdir(parents=True)
    if controller:
        (ckpt / "controller.json").write_text(json.dumps({"run_id": "r", "iteration": 1, "policy_version": 1}))
    if complete:
        (ckpt / "trainer" / "COMPLETE").write_text("ok\n")
    return ckpt


def _run(tmp_path: Path, *names: str, latest: str | None = None) -> Path:
    """A run directory as `agentrl train` lays it out (no weights: the checks never read them)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run:\n  name: r\n")
    for n in names:
        _checkpoint(run, n)
    if latest is not None:
        (run / "checkpoints").mkdir(exist_ok=True)
        (run / "checkpoints" / "latest").write_text(latest)
    return run


# --------------------------------------------------------------------- run and checkpoint


def test_the_latest_checkpoint_is_the_default_and_others_are_picked_by_name(tmp_path):
    run = _run(tmp_path, "iter_1", "iter_2", latest="iter_2")
    assert resolve_checkpoint(run) == run / "checkpoints" / "iter_2"
    assert resolve_checkpoint(run, "iter_1") == run / "checkpoints" / "iter_1"


@pytest.mark.parametrize("make", ["missing", "no_config"])
def test_a_folder_that_is_not_a_run_is_refused(tmp_path, make):
    path = tmp_path / "nothing"
    if make == "no_config":
        path.mkdir()
        (path / "notes.txt").write_text("not a run")
    with pytest.raises(ConfigError, match="is not a run directory") as e:
        resolve_checkpoint(path)
    assert str(path) in str(e.value)


def test_a_run_without_a_checkpoint_is_refused(tmp_path):
    run = _run(tmp_path)
    with pytest.raises(ConfigError, match="has no checkpoint yet"):
        resolve_checkpoint(run)


def test_an_unknown_checkpoint_name_lists_the_ones_there(tmp_path):
    run = _run(tmp_path, "iter_2", "iter_10", latest="iter_10")
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(run, "iter_9")
    assert "'iter_9' does not exist" in str(e.value) and "available: iter_2, iter_10" in str(e.value)


@pytest.mark.parametrize("name", ["../run", "iter_1/trainer", "", ".."])
def test_a_checkpoint_that_is_not_a_plain_name_is_refused(tmp_path, name):
    run = _run(tmp_path, "iter_1", latest="iter_1")
    with pytest.raises(ConfigError, match="expected a checkpoint name"):
        resolve_checkpoint(run, name)


@pytest.mark.parametrize("controller, complete, missing", [
    (True, False, "trainer/COMPLETE"),
    (False, True, "controller.json"),
])
def test_an_incomplete_checkpoint_is_refused(tmp_path, controller, complete, missing):
    run = _run(tmp_path, "iter_1", latest="iter_1")
    _checkpoint(run, "iter_2", controller=controller, complete=complete)
    with pytest.raises(CheckpointError, match="is incomplete") as e:
        resolve_checkpoint(run, "iter_2")
    assert missing in str(e.value) and "iter_2" in str(e.value)


def test_latest_naming_a_checkpoint_whose_trainer_did_not_finish_is_refused(tmp_path):
    run = _run(tmp_path, latest="iter_1")
    _checkpoint(run, "iter_1", complete=False)
    with pytest.raises(CheckpointError, match="incomplete"):
        resolve_checkpoint(run)


# --------------------------------------------------------------------- OUT_DIR


def test_a_new_out_dir_is_fine_and_an_existing_one_needs_force(tmp_path):
    assert check_out_dir(tmp_path / "new", force=False) is False
    old = tmp_path / "old"
    old.mkdir()
    with pytest.raises(ConfigError, match="already exists; pass --force") as e:
        check_out_dir(old, force=False)
    assert str(old) in str(e.value)
    assert check_out_dir(old, force=True) is True  # empty


def test_force_replaces_only_an_earlier_export(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / EXPORT_MARKER).write_text("{}")
    (export / "model.safetensors").write_bytes(b"x")
    assert is_export(export) and check_out_dir(export, force=True) is True

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(ConfigError, match="refusing to delete it even with --force") as e:
        check_out_dir(mine, force=True)
    assert str(mine) in str(e.value) and EXPORT_MARKER in str(e.value)
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_an_out_dir_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    for force in (False, True):
        with pytest.raises(ConfigError, match="is not a plain directory"):
            check_out_dir(f, force=force)
    assert f.read_bytes() == b"x"


def test_prepare_export_checks_dtype_and_where_out_dir_is(tmp_path):
    run = _run(tmp_path, "iter_1", latest="iter_1")
    with pytest.raises(ConfigError, match="--dtype='float16'; expected one of float32, bfloat16"):
        prepare_export(run, tmp_path / "out", dtype="float16")
    for inside in (run, run / "checkpoints" / "export"):
        with pytest.raises(ConfigError, match="is the run directory, inside its checkpoints"):
            prepare_export(run, inside)
    req = prepare_export(run, tmp_path / "out", dtype="bfloat16")
    assert req.checkpoint == (run / "checkpoints" / "iter_1").absolute()
    assert req.out_dir == (tmp_path / "out").absolute() and req.dtype == "bfloat16" and not req.replaces
    assert not (tmp_path / "out").exists()  # checks write nothing


def test_force_never_deletes_the_run_or_its_model_folder(tmp_path):
    """--force replaces an earlier export, but not one that holds the run, not the run
    through a link, and not the folder the run trained from (a run started from an earlier
    export: replacing it would break the run's resume and its reference model)."""
    holder = tmp_path / "exports"
    holder.mkdir()
    (holder / EXPORT_MARKER).write_text("{}")
    run = _run(holder, "iter_1", latest="iter_1")  # the run lives inside an earlier export
    with pytest.raises(ConfigError, match="a folder that holds the run"):
        prepare_export(run, holder, force=True)
    link = tmp_path / "link-to-run"
    link.symlink_to(run)
    with pytest.raises(ConfigError, match="is the run directory"):
        prepare_export(run, tmp_path / "link-to-run" / ".", force=True)
    model = tmp_path / "models" / "v1"  # an earlier export the run trained from
    model.mkdir(parents=True)
    (model / EXPORT_MARKER).write_text("{}")
    (model / "config.json").write_text("{}")
    (run / "config.yaml").write_text(f"run:\n  name: r\nmodel:\n  path: {model}\n")
    for out in (model, model.parent):
        with pytest.raises(ConfigError, match=r"is or holds the run's model folder"):
            prepare_export(run, out, force=True)
    assert (model / "config.json").is_file() and (holder / EXPORT_MARKER).is_file()
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / EXPORT_MARKER).write_text("{}")
    assert prepare_export(run, tmp_path / "v2", force=True).replaces  # another earlier export: fine


# --------------------------------------------------------------------- the CLI's errors


@pytest.mark.parametrize("case, needle", [
    ("not_a_run", "is not a run directory"),
    ("no_such_checkpoint", "--checkpoint='iter_7' does not exist"),
    ("incomplete", "is incomplete (no trainer/COMPLETE)"),
    ("exists", "already exists; pass --force"),
    ("not_an_export", "refusing to delete it even with --force"),
    ("holds_the_run", "a folder that holds the run"),
    ("dtype", "--dtype='fp8'"),
])
def test_cli_reports_bad_input_in_one_line_with_exit_2(tmp_path, case, needle):
    from typer.testing import CliRunner

    from agentrl.cli import app

    run = _run(tmp_path, "iter_1", latest="iter_1")
    _checkpoint(run, "iter_2", complete=False)
    out = tmp_path / "out"
    other = tmp_path / "other"  # an existing folder that agentrl export did not write
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    args = {
        "not_a_run": [str(tmp_path / "nope"), str(out)],
        "no_such_checkpoint": [str(run), "--checkpoint", "iter_7", str(out)],
        "incomplete": [str(run), "--checkpoint", "iter_2", str(out)],
        "exists": [str(run), str(other)],
        "not_an_export": [str(run), str(other), "--force"],
        "holds_the_run": [str(run), str(tmp_path), "--force"],
        "dtype": [str(run), str(out), "--dtype", "fp8"],
    }[case]
    r = CliRunner().invoke(app, ["export", *args], env={"COLUMNS": "400"})
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert r.output.strip().startswith("error:") and len(r.output.strip().splitlines()) == 1
    assert not out.exists() and (other / "notes.txt").read_text() == "keep"


# --------------------------------------------------------------------- trainer-side pieces


def test_drop_tied_copies_keeps_the_source_key_once():
    w = torch.arange(6.0).reshape(3, 2)
    sd = {"model.embed_tokens.weight": w, "lm_head.weight": w.clone(), "model.norm.weight": torch.ones(2)}
    tied = {"lm_head.weight": "model.embed_tokens.weight"}
    out = drop_tied_copies(sd, tied)
    assert sorted(out) == ["model.embed_tokens.weight", "model.norm.weight"]
    assert out["model.embed_tokens.weight"] is w
    assert "lm_head.weight" in sd  # the input is not changed
    assert drop_tied_copies(sd, {}) == sd  # untied model: nothing dropped
    assert sorted(drop_tied_copies({"lm_head.weight": w}, tied)) == ["lm_head.weight"]  # no source: kept


def test_drop_tied_copies_refuses_weights_that_differ():
    sd = {"model.embed_tokens.weight": torch.zeros(3, 2), "lm_head.weight": torch.zeros(3, 2)}
    sd["lm_head.weight"][1, 0] = 1e-6
    with pytest.raises(ContractError, match="'lm_head.weight' is declared tied to 'model.embed_tokens.weight'"):
        drop_tied_copies(sd, {"lm_head.weight": "model.embed_tokens.weight"})


class _Bigram(torch.nn.Module):
    """A causal LM whose logits at position t are ``table[ids[t]]`` (known log-probs)."""

    def __init__(self, table: torch.Tensor, tie: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(*table.shape)
        self.embed.weight.data.copy_(table)
        self.head = torch.nn.Linear(table.shape[1], table.shape[0], bias=False)
        if tie:
            self.head.weight = self.embed.weight
        self.all_tied_weights_keys = {"head.weight": "embed.weight"}

    def forward(self, input_ids):
        class Out:
            logits = self.embed(input_ids)  # (1, L, V)

        return Out()


def test_reference_log_probs_are_log_softmax_of_logits_over_temperature_per_row():
    table = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # (V, V)
    model = _Bigram(table, tie=False)
    ids = torch.tensor([0, 2, 1, 1, 0])  # rows [0, 2, 1] and [1, 0]
    got = reference_log_probs(model, ids, [3, 2], temperature=2.0)  # (T,)

    def lp(prev, nxt):
        z = [x / 2.0 for x in table[prev].tolist()]
        return z[nxt] - math.log(sum(math.exp(v) for v in z))

    want = [0.0, lp(0, 2), lp(2, 1), 0.0, lp(1, 0)]  # 0 at each row's first token
    assert got.dtype == torch.float32 and got.shape == (5,)
    assert torch.allclose(got, torch.tensor(want), atol=5e-7, rtol=0)  # fp32 rounding of values near 1
    with pytest.raises(ContractError, match="sum to len"):
        reference_log_probs(model, ids, [3, 3], temperature=1.0)
    with pytest.raises(ContractError, match="temperature=0"):
        reference_log_probs(model, ids, [3, 2], temperature=0)


def test_untied_pairs_names_declared_ties_that_do_not_share_storage():
    table = torch.zeros(3, 3)
    assert untied_pairs(_Bigram(table, tie=True)) == []
    assert untied_pairs(_Bigram(table, tie=False)) == [("head.weight", "embed.weight")]


def test_restore_user_config_gives_back_use_cache_dropout_and_states_the_dtype(tmp_path):
    written = tmp_path / "config.json"
    written.write_text(json.dumps({"use_cache": False, "attention_dropout": 0.0, "hidden_size": 64, "dtype": "float32"}))
    source = tmp_path / "source.json"
    source.write_text(json.dumps({"use_cache": True, "attention_dropout": 0.1, "hidden_size": 999}))
    restore_user_config(written, source, torch.bfloat16)
    cfg = json.loads(written.read_text())
    assert cfg == {"use_cache": True, "attention_dropout": 0.1, "hidden_size": 64, "dtype": "bfloat16"}
    restore_user_config(written, tmp_path / "absent.json", torch.float32)  # a hub model: no source file
    assert json.loads(written.read_text())["use_cache"] is True
    assert json.loads(written.read_text())["dtype"] == "float32"


def test_the_export_needs_no_kl_reference_model(tmp_path, tiny_model_path):
    """A run trained with a KL penalty toward a reference model that is not on this machine:
    the export's scoring config has no penalty and no reference (nothing is trained), so the
    reference folder is never read (its vocabulary check needed its config.json)."""
    import yaml

    from agentrl.config import load_default_config

    missing = tmp_path / "reference-model-not-here"
    data = load_default_config([f"model.path={tiny_model_path}"]).model_dump(mode="json")
    data["trainer"]["kl"].update(coef=0.05, reference_path=str(missing))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = export_config(tmp_path)
    assert cfg.trainer.kl.reference_path == str(missing)  # as the run had it
    policy = _export_trainer_config(cfg, tiny_model_path)
    assert policy.kl.coef == 0.0 and policy.kl.reference_path is None
    assert (policy.dtype, policy.device, policy.micro_batch_size) == ("float32", "cpu", 1)
    assert cfg.trainer.kl.reference_path == str(missing)  # the caller's config is left as it was
