"""The run directory: config, metrics log, checkpoints, and what a resume resets.

Layout::

    RUN_DIR/config.yaml          the validated config (resume reads it)
    RUN_DIR/metrics.jsonl        one JSON object per iteration, exactly once each
    RUN_DIR/replay.db            SQLite replay store (unless replay.url is set)
    RUN_DIR/checkpoints/iter_N/  trainer/ (model, optimizer, scheduler, RNG) + controller.json
    RUN_DIR/checkpoints/latest   name of the newest complete checkpoint (written last)

Crash safety. A checkpoint is written into ``checkpoints/.iter_N.tmp``, renamed to ``iter_N``
and only then named by ``latest`` (an atomic ``os.replace``), so ``latest`` always names a
whole checkpoint. An iteration's episodes and metrics are written before the checkpoint that
covers it (with ``run.checkpoint_every > 1``, several iterations before it); a crash leaves
them behind for the iterations after ``latest``. A resume therefore resets both logs to the
checkpoint: ``RunDir.reset_metrics`` rewrites ``metrics.jsonl`` from the checkpoint's history
(atomically), and the replay store's ``rewind`` drops the abandoned iterations' rows (see
``agentrl.driver.controller``).

Iterations are numbered from 1 (docs/design.md, "Iteration numbering"): ``iter_N`` is the
state after iteration N, so N is both the last iteration's number and the iterations done.

Checkpoint format (``CHECKPOINT_FORMAT``, the ``format`` key of ``controller.json``). Format 2
numbers every iteration it records from 1. A checkpoint without the key (format 1, written
before) recorded the iteration fields of its skip set (``tasks.skip.iteration``), its pending
evals (``eval.pending[].iteration``) and its pending requests
(``async.pending_requests[].iteration``) 0-based; ``load_state`` shifts them by one
(``upgrade_state``) so a resumed run numbers on as a new one does (its top-level
``iteration`` was always the count of iterations done). A format newer than this agentrl's is a
``CheckpointError`` naming the file.

Test hook. ``kill_point(phase, iteration)`` SIGKILLs the process when the environment variable
``AGENTRL_TEST_KILL_AT`` is ``"{phase}:it={N}"``, N the iteration (metrics.jsonl's and the
replay store's ``iteration``, the checkpoint ``iter_N``). It
does nothing unless the variable is set; only the resume tests set it. The phases, in the
order a checkpointed iteration passes them: ``mid_rollout`` (the iteration's episodes
collected, its update not started; in async mode other episodes are still running),
``mid_update`` (the trainer step called, not returned), ``mid_sync`` (the new weights are in
the engines, the controller has not recorded the new policy version),
``after_replay_write`` (episodes stored), ``after_metrics`` (metrics.jsonl line and store
metrics written), ``mid_checkpoint_state`` (the trainers' state written into
``.iter_N.tmp``, the controller state not yet), ``mid_checkpoint`` (the checkpoint directory
``iter_N`` complete, ``latest`` not yet naming it), ``after_checkpoint`` (``latest`` names
it, the store's completion marks not yet written).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from agentrl.config import Config, config_from_dict
from agentrl.errors import CheckpointError

log = logging.getLogger(__name__)

CONTROLLER_STATE = "controller.json"
"""File of a checkpoint holding the controller's state (run id, iteration, task cursor, history)."""
CHECKPOINT_FORMAT = 2
"""Format of ``controller.json`` this agentrl writes (module docstring): 2, iterations
numbered from 1; 1 (no ``format`` key), 0-based iteration fields, upgraded on load."""
KILL_AT_ENV = "AGENTRL_TEST_KILL_AT"
"""Test hook (see the module docstring): ``"{phase}:it={N}"`` SIGKILLs the run there."""
KILL_SIGNAL_ENV = "AGENTRL_TEST_KILL_SIGNAL"
"""Test hook: ``TERM`` makes ``kill_point`` send SIGTERM instead of SIGKILL."""
KILL_PHASES = ("mid_rollout", "mid_update", "mid_sync", "after_replay_write", "after_metrics",
               "mid_checkpoint_state", "mid_checkpoint", "after_checkpoint")
KEEP_CHECKPOINTS = 2
"""Checkpoints kept on disk: the newest two."""


def kill_point(phase: str, iteration: int) -> None:
    """Test hook: SIGKILL this process if ``$AGENTRL_TEST_KILL_AT == f"{phase}:it={iteration}"``
    (``iteration``: the iteration's number, from 1). A no-op when the variable is unset.

    Raises:
        CheckpointError: the variable is set but names no phase of ``KILL_PHASES`` (a typo
            would otherwise let the test's run finish unkilled).
    """
    spec = os.environ.get(KILL_AT_ENV)
    if not spec:
        return
    if spec.split(":", 1)[0] not in KILL_PHASES:
        raise CheckpointError(f"{KILL_AT_ENV}={spec!r}; expected '<phase>:it=<N>' with phase one of {KILL_PHASES}")
    if spec == f"{phase}:it={iteration}":
        # $AGENTRL_TEST_KILL_SIGNAL=TERM: a SIGTERM instead (the interrupt path: the handler
        # raises KeyboardInterrupt here, with whatever runs in other threads still running)
        term = os.environ.get(KILL_SIGNAL_ENV, "KILL").upper() == "TERM"
        os.kill(os.getpid(), signal.SIGTERM if term else signal.SIGKILL)


class RunDir:
    """A run directory (layout in the module docstring).

    Args:
        path: the directory; nothing is created until a method writes.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.config_path = self.path / "config.yaml"
        self.metrics_path = self.path / "metrics.jsonl"
        self.checkpoints = self.path / "checkpoints"
        self.sinks: Any = None
        """``agentrl.driver.metric_sinks.Sinks`` that each appended line also goes to
        (TensorBoard, W&B: ``logging.*``); None: metrics.jsonl only."""

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def replay_url(self) -> str:
        """The embedded SQLite replay store of this run: ``sqlite:///RUN_DIR/replay.db`` (absolute)."""
        return f"sqlite:///{(self.path / 'replay.db').resolve()}"

    def holds_run(self) -> bool:
        """A checkpoint pointer exists: a run was started here and reached a checkpoint."""
        return (self.checkpoints / "latest").exists()

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint ``latest`` names, or ``None`` before the first checkpoint.

        Raises:
            CheckpointError: ``latest`` names a directory without ``controller.json``.
        """
        pointer = self.checkpoints / "latest"
        if not pointer.is_file():
            return None
        ckpt = self.checkpoints / pointer.read_text().strip()
        if not (ckpt / CONTROLLER_STATE).is_file():
            raise CheckpointError(f"checkpoint pointer names {ckpt}, which has no {CONTROLLER_STATE}")
        return ckpt

    def load_state(self, ckpt: Path) -> dict[str, Any]:
        """The controller state saved in checkpoint ``ckpt`` (``format``, ``run_id``,
        ``iteration``: the iterations done, ``policy_version``, ``tasks``, ``history``), at
        ``CHECKPOINT_FORMAT`` (a format-1 state is upgraded: ``upgrade_state``).

        Raises:
            CheckpointError: a format this agentrl does not know, or a format-1 state whose
                iteration fields are not integers; the message names the file.
        """
        path = ckpt / CONTROLLER_STATE
        state = json.loads(path.read_text())
        if state.get("format", 1) == 1:
            profiles = sorted((self.path / "profiles").glob("iter_*.json"))
            log.warning("checkpoint %s was written before iterations were numbered from 1: its skip set, pending "
                        "evals and pending requests are read one iteration later (checkpoint format 1 -> %d)%s",
                        path, CHECKPOINT_FORMAT,
                        f"; the {len(profiles)} files profiles/iter_K.json written before it are named by the "
                        "0-based iteration they preceded (iter_K: the profile before iteration K + 1)" if profiles else "")
        return upgrade_state(state, path)

    def write_config(self, config: dict[str, Any]) -> None:
        """Write ``config.yaml`` (creates the directory)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def load_config(self, overrides: Sequence[str]) -> Config:
        """Config of the run here (for ``--resume``), with overrides such as
        ``run.iterations=6`` applied on top; ``run.dir`` is this directory.

        Raises:
            CheckpointError: no ``config.yaml`` here.
        """
        if not self.config_path.is_file():
            raise CheckpointError(f"{self.path} is not a run directory (no config.yaml)")
        cfg = config_from_dict(yaml.safe_load(self.config_path.read_text()), list(overrides))
        cfg.run.dir = str(self.path)
        return cfg

    def append_metrics(self, line: dict[str, float | None]) -> None:
        """Append one iteration's metrics to ``metrics.jsonl`` as one JSON line, then hand it
        to the attached metric sinks (``sinks``), the same names and values."""
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        if self.sinks:
            self.sinks.write(line)

    def reset_metrics(self, history: Sequence[dict[str, float | None]]) -> None:
        """Make ``metrics.jsonl`` hold exactly ``history``, one line each (the checkpoint's
        history on resume, ``[]`` for a new run), replacing it atomically (a temporary file,
        then ``os.replace``): lines of iterations after the checkpoint, written by an attempt
        a crash abandoned, are gone, and a crash during the reset leaves the old file."""
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / ".metrics.jsonl.tmp"
        with tmp.open("w") as f:
            for line in history:
                f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.metrics_path)

    def rewind(self, iterations_done: int, history: Sequence[dict[str, float | None]]) -> None:
        """Reset the directory to the checkpoint taken after ``iterations_done`` iterations
        before a resume: ``metrics.jsonl`` holds exactly ``history`` (``reset_metrics``), and
        checkpoint directories of later iterations (complete ones that ``latest`` never
        named, and half-written ``.iter_N.tmp``) of the abandoned attempt are removed."""
        self.reset_metrics(history)
        for p in self.checkpoints.glob("*iter_*"):
            n = p.name.removeprefix(".").removesuffix(".tmp").removeprefix("iter_")
            if p.is_dir() and (p.name.startswith(".") or (n.isdigit() and int(n) > iterations_done)):
                shutil.rmtree(p, ignore_errors=True)

    def save_checkpoint(self, iteration: int, state: dict[str, Any],
                        save_trainers: Callable[[Path], None]) -> Path:
        """Write checkpoint ``iter_{iteration}`` (``iteration`` = iterations done) and point
        ``latest`` at it; keep the newest ``KEEP_CHECKPOINTS``.

        Args:
            state: the controller state, JSON-serializable; stored as ``controller.json``.
            save_trainers: writes the trainers' state into the directory it is given
                (``trainer/`` and, with a critic, ``trainer_critic/``).

        Returns:
            The checkpoint directory.
        """
        name = f"iter_{iteration}"
        tmp = self.checkpoints / f".{name}.tmp"
        final = self.checkpoints / name
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        save_trainers(tmp)
        kill_point("mid_checkpoint_state", iteration)  # trainers written, controller state not yet
        (tmp / CONTROLLER_STATE).write_text(json.dumps(state, indent=2))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        kill_point("mid_checkpoint", iteration)
        pointer_tmp = self.checkpoints / ".latest.tmp"
        pointer_tmp.write_text(name)
        os.replace(pointer_tmp, self.checkpoints / "latest")
        olds = sorted((p for p in self.checkpoints.glob("iter_*") if p.is_dir()), key=lambda p: int(p.name.split("_")[1]))
        for p in olds[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(p, ignore_errors=True)
        return final


def upgrade_state(state: dict[str, Any], path: Path | str) -> dict[str, Any]:
    """``state`` (a ``controller.json`` read from ``path``) at ``CHECKPOINT_FORMAT``: a
    format-1 state (no ``format`` key) gets its 0-based iteration fields shifted by one
    (module docstring); the eval of the starting policy (``eval_before``) stays iteration 0.
    A new dict; ``state`` is not changed.

    Raises:
        CheckpointError: a ``format`` other than 1 or ``CHECKPOINT_FORMAT``, or a format-1
            iteration field that is not an integer; the message names ``path``.
    """
    fmt = state.get("format", 1)
    if fmt == CHECKPOINT_FORMAT:
        return state
    if fmt != 1:
        raise CheckpointError(f"{path}: checkpoint format {fmt!r}; this agentrl reads formats 1 and "
                              f"{CHECKPOINT_FORMAT} (a newer agentrl wrote it?)")
    out = json.loads(json.dumps(state))  # a deep copy

    def shifted(record: dict[str, Any], where: str) -> None:
        it = record.get("iteration")
        if not isinstance(it, int) or isinstance(it, bool) or it < 0:
            raise CheckpointError(f"{path}: {where}.iteration = {it!r}; expected a 0-based iteration (an int >= 0) "
                                  "in a checkpoint of format 1")
        record["iteration"] = it + 1

    skip = (out.get("tasks") or {}).get("skip")
    if isinstance(skip, dict):
        shifted(skip, "tasks.skip")
    for k, job in enumerate(((out.get("eval") or {}).get("pending")) or []):
        if isinstance(job, dict) and job.get("name", "eval") != "eval_before":
            shifted(job, f"eval.pending[{k}]")
    for k, req in enumerate(((out.get("async") or {}).get("pending_requests")) or []):
        if isinstance(req, dict):
            shifted(req, f"async.pending_requests[{k}]")
    out["format"] = CHECKPOINT_FORMAT
    return out


def latest_checkpoint(run_dir: Path) -> Path | None:
    """``RunDir(run_dir).latest_checkpoint()``."""
    return RunDir(run_dir).latest_checkpoint()


def load_run_config(run_dir: Path, overrides: list[str]) -> Config:
    """Config of an existing run (for ``--resume``), with overrides such as
    ``run.iterations=6`` applied on top (``RunDir.load_config``)."""
    return RunDir(run_dir).load_config(overrides)
