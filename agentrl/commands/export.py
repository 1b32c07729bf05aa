"""``agentrl export``: a run's trainer checkpoint → a plain Hugging Face folder, checked.

What it does, in one process (no Ray, no engine):

1. ``prepare_export`` checks the arguments before anything is loaded: ``RUN_DIR`` holds a
   run (``config.yaml``), the checkpoint (``checkpoints/latest`` by default, or one picked
   by name) is complete (``controller.json`` and ``trainer/COMPLETE``), and ``OUT_DIR``
   either does not exist or, with ``force``, is empty or an earlier export (it holds
   ``EXPORT_MARKER``). Nothing else is ever deleted.
2. ``export_run`` reads the sections of the run's config that scoring needs
   (``export_config``: never the env section, so the run's environment code need not be
   importable here), builds a ``PolicyTrainer`` on the run's prepared model folder (the
   run's ``model.path`` resolved as the controller does it) in a gloo process group of
   one, fp32 on CPU with one row per micro-batch (``_export_trainer_config`` says why),
   loads the checkpoint (``load_checkpoint``), scores a fixed batch (``compute_log_probs``)
   and writes the folder with ``save_hf`` into a staging directory beside ``OUT_DIR``.
3. The round-trip check: the staged folder is loaded with plain transformers
   (``AutoModelForCausalLM``, fp32) and scores the same batch
   (``agentrl.trainer.export.reference_log_probs``); the largest difference must be at
   most ``ROUND_TRIP_TOLERANCE`` (1e-6, fp32). Tied weights must be stored once and tied
   again on reload (shared storage). With ``dtype="bfloat16"`` the check runs on the fp32
   folder *before the cast*, and the bf16 folder is then checked to hold exactly the fp32
   tensors rounded to bf16 (same keys, ``torch.equal``): log-probs from bf16 weights move
   by far more than 1e-6 (8 mantissa bits), so a tolerance there would check nothing.
4. Only a folder that passed is moved to ``OUT_DIR`` (a rename; an earlier export there is
   replaced), with ``EXPORT_MARKER`` recording where it came from and the check's numbers.
   A failed check leaves ``OUT_DIR`` as it was. Every file has the mode of a newly created
   file under the umask (``save_hf``; safetensors alone would leave the weights 0600).

The fixed batch: ``CHECK_PROMPTS`` rendered with the exported tokenizer's chat template
(plain text without one), every token after a row's first scored, at the run's sampling
temperature (``rollout.temperature``).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.config import config_from_dict, trainer_configs
from agentrl.driver.checkpoint import CONTROLLER_STATE, RunDir
from agentrl.errors import CheckpointError, ConfigError, ContractError
from agentrl.model_zoo import resolve_model_path
from agentrl.trainer import PolicyTrainer, init_single_process_group
from agentrl.types import SamplingRecord, TokenBatch, TokenSequence

EXPORT_MARKER = "agentrl_export.json"
"""File in every exported folder: what was exported, from where, and the check's result.
``--force`` replaces only a folder that holds it (or an empty one)."""
ROUND_TRIP_TOLERANCE = 1e-6
"""Largest |trainer - exported| log-prob difference allowed (nats, fp32)."""
EXPORT_DTYPES = ("float32", "bfloat16")
CHECK_PROMPTS = (
    "What is 2 + 3?",
    "Write a Python function that returns the reverse of a string.",
    "I am thinking of a number between 1 and 10. Guess it; I will say higher or lower.",
)
"""The user turns of the fixed batch the round-trip check scores (one row each)."""
EXPORT_SECTIONS = ("run", "model", "rollout", "trainer")
"""The sections of a run's ``config.yaml`` an export reads (``export_config``): ``model``
(path, dtype), ``trainer`` and ``run.seed`` to score as the trainer did, and
``rollout.temperature`` for the check batch. ``env`` (whose ``import_modules`` are the
user's environment code), ``algorithm`` (an estimator such a module may register) and the
rest take their defaults: exporting weights needs no environment."""
TRAINER_DIR = "trainer"
"""The policy trainer's part of a checkpoint ``iter_N/`` (``PolicyTrainer.save_checkpoint``)."""
COMPLETE_MARKER = "COMPLETE"


class ExportCheckError(ContractError):
    """The exported folder does not reproduce the trainer (log-probs, tied weights or the
    bf16 cast): a bug in the export, never written to ``OUT_DIR``."""


@dataclass(frozen=True)
class ExportRequest:
    """Checked arguments of one export (``prepare_export``).

    Attributes:
        run_dir: the run directory.
        checkpoint: the checkpoint directory ``RUN_DIR/checkpoints/iter_N``.
        out_dir: where the folder goes.
        dtype: ``"float32"`` or ``"bfloat16"``, the weights written.
        replaces: ``out_dir`` exists (empty, or an earlier export) and will be replaced.
    """

    run_dir: Path
    checkpoint: Path
    out_dir: Path
    dtype: str
    replaces: bool


@dataclass
class ExportReport:
    """What ``export_run`` wrote and measured.

    Attributes:
        out_dir: the exported folder.
        checkpoint: its checkpoint's name (``iter_N``); ``policy_version``, ``run_id`` from
            the checkpoint's controller state; ``global_step`` from the trainer's.
        dtype: weights written. num_params: parameters stored (a tied tensor once).
        tied: ``{dropped key: kept key}`` of the tied weights stored once.
        files: ``(name, bytes)`` of every file written, sorted.
        rows, tokens: the fixed batch scored (tokens compared: all but each row's first).
        max_abs_diff: largest |trainer - exported| log-prob (fp32 folder), nats.
        tolerance: ``ROUND_TRIP_TOLERANCE``. temperature: the run's sampling temperature.
        bf16_cast_exact: with ``dtype="bfloat16"``, every written tensor equals the checked
            fp32 tensor rounded to bf16 (``None`` for fp32).
        seconds: wall time of the export.
    """

    out_dir: Path
    checkpoint: str
    run_id: str
    policy_version: int
    global_step: int
    dtype: str
    num_params: int
    tied: dict[str, str]
    files: list[tuple[str, int]]
    rows: int
    tokens: int
    max_abs_diff: float
    tolerance: float
    temperature: float
    bf16_cast_exact: bool | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def marker(self) -> dict[str, Any]:
        """The JSON written to ``EXPORT_MARKER``."""
        d = dataclasses.asdict(self)
        d["out_dir"] = str(self.out_dir)
        d["files"] = [list(f) for f in self.files]
        return d


# --------------------------------------------------------------------- argument checks


def resolve_checkpoint(run_dir: str | Path, checkpoint: str | None = None) -> Path:
    """The checkpoint directory to export: ``checkpoints/latest``'s, or ``checkpoint`` by
    name (``iter_N``).

    Raises:
        ConfigError: ``run_dir`` is not a run directory (no ``config.yaml``), it has no
            checkpoint yet, or ``checkpoint`` is not a plain name.
        CheckpointError: the named checkpoint does not exist (the message lists those
            that do) or is incomplete (no ``controller.json`` or ``trainer/COMPLETE``).
    """
    rd = RunDir(run_dir)
    if not rd.path.is_dir() or not rd.config_path.is_file():
        raise ConfigError(
            f"RUN_DIR={str(rd.path)!r} is not a run directory (expected a directory with config.yaml "
            "and checkpoints/, written by `agentrl train`)"
        )
    available = sorted(
        (p.name for p in rd.checkpoints.glob("iter_*") if p.is_dir()),
        key=lambda n: int(n.split("_")[1]) if n.split("_")[1].isdigit() else -1,
    )
    if checkpoint is None:
        ckpt = rd.latest_checkpoint()
        if ckpt is None:
            raise ConfigError(
                f"RUN_DIR={str(rd.path)!r} has no checkpoint yet (no checkpoints/latest); a run writes "
                "one every run.checkpoint_every iterations"
            )
    else:
        if not checkpoint or "/" in checkpoint or "\\" in checkpoint or checkpoint in (".", ".."):
            raise ConfigError(f"--checkpoint={checkpoint!r}; expected a checkpoint name such as 'iter_3'")
        ckpt = rd.checkpoints / checkpoint
        if not ckpt.is_dir():
            raise CheckpointError(
                f"--checkpoint={checkpoint!r} does not exist in {rd.checkpoints}; "
                f"available: {', '.join(available) or 'none'}"
            )
    missing = [p for p in (CONTROLLER_STATE, f"{TRAINER_DIR}/{COMPLETE_MARKER}") if not (ckpt / p).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {str(ckpt)!r} is incomplete (no {' or '.join(missing)}): its writer did not "
            f"finish; complete checkpoints here: {', '.join(available) or 'none'}"
        )
    return ckpt


def is_export(path: str | Path) -> bool:
    """``path`` is a folder an earlier ``agentrl export`` wrote (it holds ``EXPORT_MARKER``)."""
    return (Path(path) / EXPORT_MARKER).is_file()


def check_out_dir(out_dir: str | Path, *, force: bool) -> bool:
    """Whether ``out_dir`` may be written; returns True when it exists and will be replaced.

    Raises:
        ConfigError: ``out_dir`` exists and ``force`` is false; or it is a file; or, with
            ``force``, a non-empty folder that is not an earlier export (never deleted).
    """
    out = Path(out_dir)
    if not out.exists() and not out.is_symlink():
        return False
    if not out.is_dir() or out.is_symlink():
        raise ConfigError(f"OUT_DIR={str(out)!r} exists and is not a plain directory (a file or a link); "
                          "expected a new folder")
    if not force:
        raise ConfigError(f"OUT_DIR={str(out)!r} already exists; pass --force to replace it (only an earlier "
                          "export or an empty folder is replaced)")
    if any(out.iterdir()) and not is_export(out):
        raise ConfigError(
            f"OUT_DIR={str(out)!r} is a non-empty folder that agentrl export did not write (no {EXPORT_MARKER}); "
            "refusing to delete it even with --force: choose another OUT_DIR"
        )
    return True


def prepare_export(
    run_dir: str | Path, out_dir: str | Path, *, checkpoint: str | None = None, force: bool = False,
    dtype: str = "float32",
) -> ExportRequest:
    """Check every argument of an export before anything is loaded or written.

    Raises:
        ConfigError: an unknown ``dtype``, a ``run_dir`` that is not a run, ``out_dir``
            inside the run's checkpoints, or an ``out_dir`` that may not be written
            (``check_out_dir``).
        CheckpointError: a checkpoint that does not exist or is incomplete
            (``resolve_checkpoint``).
    """
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"--dtype={dtype!r}; expected one of {', '.join(EXPORT_DTYPES)}")
    ckpt = resolve_checkpoint(run_dir, checkpoint)
    out = Path(out_dir).absolute()
    run = Path(run_dir).absolute()
    # compared with links resolved, so a link to the run cannot get around the checks
    out_r, run_r = out.resolve(), run.resolve()
    if out_r == run_r or (run_r / "checkpoints") in (out_r, *out_r.parents) or out_r in run_r.parents:
        raise ConfigError(f"OUT_DIR={str(out_dir)!r} is the run directory, inside its checkpoints or a folder "
                          "that holds the run; expected a folder of its own")
    model_dir = _local_model_dir(run)
    if model_dir is not None and (out_r == model_dir or out_r in model_dir.parents):
        # e.g. a run that trained from an earlier export: --force would delete the folder the
        # run (its resume and its reference model) loads from
        raise ConfigError(f"OUT_DIR={str(out_dir)!r} is or holds the run's model folder (model.path={str(model_dir)!r}); "
                          "expected a folder of its own")
    replaces = check_out_dir(out, force=force)
    return ExportRequest(run_dir=run, checkpoint=ckpt.absolute(), out_dir=out, dtype=dtype, replaces=replaces)


def _local_model_dir(run: Path) -> Path | None:
    """The run's ``model.path`` as a resolved local folder, or ``None`` (a known model name
    or a hub id, or a ``config.yaml`` that does not name one). Read from the YAML as written,
    without validating the config (``export_config`` does, in ``export_run``)."""
    import yaml

    try:
        loaded = yaml.safe_load((run / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    model = loaded.get("model") if isinstance(loaded, dict) else None
    path = model.get("path") if isinstance(model, dict) else None
    if not isinstance(path, str) or not path:
        return None
    p = Path(path).expanduser()
    return p.resolve() if p.is_dir() else None


def export_config(run_dir: str | Path) -> Any:
    """The run's config as an export reads it: the ``EXPORT_SECTIONS`` of ``RUN_DIR/config.yaml``
    validated, every other section at its default, so nothing of the run's environment is
    imported (``env.import_modules`` is not read).

    Raises:
        ConfigError: ``config.yaml`` is missing, not a YAML mapping, or one of those sections
            is invalid (the message names the file and the key).
    """
    import yaml

    path = Path(run_dir) / "config.yaml"
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{str(path)!r} cannot be read as YAML ({exc}); expected the config.yaml `agentrl train` "
                          "wrote") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{str(path)!r} holds {type(loaded).__name__}, not a mapping; expected the config.yaml "
                          "`agentrl train` wrote")
    try:
        return config_from_dict({k: loaded[k] for k in EXPORT_SECTIONS if k in loaded})
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


# --------------------------------------------------------------------- the export


def check_batch(tokenizer: Any, temperature: float) -> Any:
    """The fixed batch of the round-trip check: one row per ``CHECK_PROMPTS`` entry, as the
    chat template renders it with the generation prompt (plain text without a template);
    ``loss_mask`` 1 on every token after the first, so every position is scored.

    Returns:
        A ``TokenBatch`` sampled at ``temperature``.
    """

    rows = []
    for i, text in enumerate(CHECK_PROMPTS):
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
        else:
            ids = tokenizer(text)["input_ids"]
        ids = [int(x) for x in ids]
        n = len(ids)
        if n < 2:
            raise ContractError(f"the tokenizer turned {text!r} into {n} token(s); the check needs at least 2")
        rows.append(TokenSequence(input_ids=ids, loss_mask=[0] + [1] * (n - 1), behavior_log_probs=[0.0] * (n - 1),
                                  advantages=[0.0] * n, group_id=f"check-{i}", policy_version=0,
                                  episode_id=f"check-{i}"))
    return TokenBatch.pack(rows, SamplingRecord(temperature=temperature))


def _export_trainer_config(cfg: Any, model_path: str) -> Any:
    """The run's policy ``TrainerConfig`` for scoring on this machine: fp32 (the master
    weights; mixed-precision compute would not be comparable at 1e-6), CPU with ``sdpa``,
    no gradient checkpointing, no KL penalty and no reference model (nothing here trains:
    ``trainer.kl.reference_path`` is dropped, so the run's reference model need not be on
    this machine), and one row per micro-batch (``micro_batch_size=1``,
    ``micro_batch_tokens=1``, in either row layout).

    Why one row: the check compares weights, not batching. Rows scored together (packed
    or padded) go through matrix products of another shape than a row alone, whose fp32
    rounding differs: on SmolLM2-135M the three check rows in one micro-batch differ from
    the plain per-row forward by up to 7.6e-6 (mean 1.3e-7) with the *source* folder, no
    export involved; one row per micro-batch gives bit-identical log-probs (0.0). How
    much batching may move log-probs is the trainer's own tested tolerance (packed vs
    padded)."""
    cfg = cfg.model_copy(deep=True)
    cfg.trainer.kl.coef = 0.0  # nothing here trains: no KL penalty, so no reference model is read
    cfg.trainer.kl.reference_path = None  # (trainer_configs would check its vocabulary: it need not be here)
    policy, _ = trainer_configs(cfg, model_path)
    return dataclasses.replace(policy, dtype="float32", device="cpu", gradient_checkpointing=False,
                               attn_implementation="sdpa", micro_batch_size=1, micro_batch_tokens=1)


def _stored_tensors(folder: Path) -> dict[str, Any]:
    """``{key: tensor}`` of every safetensors file in ``folder`` (CPU)."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _files(folder: Path) -> list[tuple[str, int]]:
    return sorted((p.name, p.stat().st_size) for p in folder.iterdir() if p.is_file())


def export_run(req: ExportRequest, progress: Callable[[str], None] | None = None) -> ExportReport:
    """Export ``req`` (from ``prepare_export``); see the module docstring for the steps.

    Runs in this process: initialises a gloo process group of one unless one of size 1
    exists (and then destroys only the group it created).

    Args:
        progress: called with a short phase name before each step (for a spinner).

    Returns:
        The report (also written to ``OUT_DIR/EXPORT_MARKER``).

    Raises:
        ExportCheckError: the round-trip check failed; ``OUT_DIR`` is untouched.
        ConfigError: a process group of more than one rank exists, the run's config cannot
            be read (``export_config``), or the run's model cannot be resolved or loaded.
        CheckpointError: the checkpoint does not match the run's model.
    """
    import torch
    import torch.distributed as dist

    from agentrl.trainer import export as hf_export  # heavy: torch

    say = progress or (lambda _phase: None)
    t0 = time.perf_counter()
    rd = RunDir(req.run_dir)
    cfg = export_config(req.run_dir)
    state = rd.load_state(req.checkpoint)
    temperature = float(cfg.rollout.temperature)
    tag = uuid.uuid4().hex[:8]
    req.out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage32 = req.out_dir.parent / f".{req.out_dir.name}.export-{tag}"
    stage16 = req.out_dir.parent / f".{req.out_dir.name}.export-{tag}-bf16"

    created_group = False
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise ConfigError(f"export runs in one process, but a process group of {dist.get_world_size()} ranks exists")
    else:
        init_single_process_group("gloo")
        created_group = True
    try:
        say("loading the checkpoint")
        model_path = resolve_model_path(cfg.model.path)
        trainer = PolicyTrainer(_export_trainer_config(cfg, model_path))
        trainer.load_checkpoint(req.checkpoint / TRAINER_DIR)
        global_step = trainer.global_step
        tied = dict(getattr(trainer.model, "all_tied_weights_keys", None) or {})

        say("writing the folder")
        trainer.save_hf(stage32)
        say("scoring the check batch with the trainer")
        from transformers import AutoTokenizer

        batch = check_batch(AutoTokenizer.from_pretrained(stage32), temperature)
        want = trainer.compute_log_probs(batch)  # (T,) float32
        if req.dtype == "bfloat16":
            say("writing the bf16 folder")
            trainer.save_hf(stage16, torch.bfloat16)
        del trainer
        gc.collect()

        say("round-trip check with transformers")
        hf_model = hf_export.load_hf_folder(stage32, "sdpa")
        got = hf_export.reference_log_probs(hf_model, batch.input_ids, batch.seq_lens, temperature)  # (T,)
        not_tied_again = hf_export.untied_pairs(hf_model)
        del hf_model
        gc.collect()
        scored = batch.loss_mask > 0  # (T,) every position but each row's first
        diff = (want - got).abs()[scored]  # (n,)
        max_diff = float(diff.max()) if diff.numel() else 0.0
        if not (max_diff <= ROUND_TRIP_TOLERANCE):  # also catches NaN
            raise ExportCheckError(
                f"round-trip check failed: log-probs of the exported folder differ from the trainer's by up to "
                f"{max_diff:.3g} nats over {int(scored.sum())} tokens (allowed {ROUND_TRIP_TOLERANCE:g}, fp32); "
                f"{req.out_dir} was not written"
            )
        stored32 = _stored_tensors(stage32)
        twice = [t for t, s in tied.items() if t in stored32 and s in stored32]
        if twice or not_tied_again:
            raise ExportCheckError(
                f"tied weights not stored once and tied again on reload (stored twice: {twice}; not re-tied by "
                f"from_pretrained: {not_tied_again}); {req.out_dir} was not written"
            )
        num_params = sum(int(t.numel()) for t in stored32.values())

        final, cast_exact = stage32, None
        if req.dtype == "bfloat16":
            say("checking the bf16 cast")
            stored16 = _stored_tensors(stage16)
            bad = sorted(set(stored16) ^ set(stored32)) or [
                k for k, v in stored32.items()
                if not torch.equal(stored16[k], v.to(torch.bfloat16) if v.is_floating_point() else v)
            ]
            if bad:
                raise ExportCheckError(
                    f"the bf16 folder is not the checked fp32 folder rounded to bf16 (keys {bad[:3]}); "
                    f"{req.out_dir} was not written"
                )
            cast_exact = True
            del stored16
            shutil.rmtree(stage32)
            final = stage16
        del stored32

        report = ExportReport(
            out_dir=req.out_dir, checkpoint=req.checkpoint.name, run_id=str(state.get("run_id", "")),
            policy_version=int(state.get("policy_version", 0)), global_step=global_step, dtype=req.dtype,
            num_params=num_params, tied={t: s for t, s in tied.items()}, files=[], rows=batch.num_rows,
            tokens=int(scored.sum()), max_abs_diff=max_diff, tolerance=ROUND_TRIP_TOLERANCE,
            temperature=temperature, bf16_cast_exact=cast_exact,
            extra={"run_dir": str(req.run_dir), "model_path": model_path},
        )
        report.seconds = time.perf_counter() - t0
        report.files = _files(final)  # the model folder's files; the marker lists them
        (final / EXPORT_MARKER).write_text(json.dumps(report.marker(), indent=2) + "\n")
        report.files = _files(final)

        say("moving the folder into place")
        _replace_dir(final, req.out_dir, allowed=req.replaces)
        return report
    finally:
        for stage in (stage32, stage16):
            if stage.exists():
                shutil.rmtree(stage, ignore_errors=True)
        if created_group and dist.is_initialized():
            dist.destroy_process_group()


def _replace_dir(src: Path, dst: Path, *, allowed: bool) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` (allowed only when ``prepare_export``
    said so, and checked again here) is renamed aside first and removed after.

    Raises:
        ConfigError: ``dst`` appeared, or stopped being an export, since the check.
    """
    if dst.exists():
        if not allowed:
            raise ConfigError(f"OUT_DIR={str(dst)!r} appeared while exporting; nothing was replaced")
        check_out_dir(dst, force=True)
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
        dst.rename(old)
        src.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        src.rename(dst)
