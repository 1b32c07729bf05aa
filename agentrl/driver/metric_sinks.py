"""Metric sinks: TensorBoard and Weights & Biases, fed the very lines ``metrics.jsonl`` gets.

``RunDir.append_metrics`` writes each iteration's line to ``metrics.jsonl`` and then hands
it to every sink attached to the run directory (``RunDir.sinks``), so the names are
``metrics.jsonl``'s own (``rollout/reward_mean``, ``eval/pass@1``, ``time/update_s`` ...)
and the step is the line's ``iteration`` (1-based, as in ``metrics.jsonl``). A null value
(``metrics.jsonl`` writes a non-finite one as null) is skipped: neither library has a
"missing" scalar. The ``iteration`` key itself is the step, not a scalar.

Exactly once, as ``metrics.jsonl``. A resume rewrites ``metrics.jsonl`` from the
checkpoint's history (``RunDir.rewind``): lines an abandoned attempt wrote after the
checkpoint are gone. The sinks follow the same rule by being rebuilt from that history
when they open (``open_sinks``):

- TensorBoard (``RUN_DIR/tensorboard``): the event files of earlier attempts are removed,
  the history is written again, then the run goes on. The new writer starts with
  ``purge_step=1`` (``torch.utils.tensorboard.SummaryWriter``), so a TensorBoard server
  that was already showing the abandoned attempt drops what it had loaded instead of
  showing an iteration twice.
- W&B offline (``RUN_DIR/wandb``): the offline run folders of earlier attempts of this run
  are removed and a new one (W&B id = the run id) gets the history again, so
  ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads each iteration once.
- W&B online: W&B cannot take back steps it has received (its "rewind" is a private
  preview), so each attempt is its own W&B run: id ``RUN_ID`` for the first,
  ``RUN_ID-resume-N`` for the attempt resumed from the checkpoint after N iterations,
  with the history logged again and ``group=RUN_ID`` tying them together. Each W&B run
  holds every iteration it covers exactly once. (Not exercised by the tests: no network.)

Failures. A missing package when the config asks for its sink is a ``ConfigError`` at
start-up naming the extra to install; a W&B run that cannot start (online without a login
or a network) is an ``InfraError`` before the first rollout. A sink that fails while writing is logged once and
switched off; ``metrics.jsonl`` and the replay store stay the run's record.
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from agentrl.errors import ConfigError, ContractError, InfraError

log = logging.getLogger(__name__)

__all__ = ["MetricSink", "Sinks", "TensorBoardSink", "WandbSink", "check_packages", "open_sinks", "scalars_of",
           "wandb_run_id"]

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"


class MetricSink(Protocol):
    """Receives each iteration's metrics line once, in iteration order."""

    name: str

    def write(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars_of(line: Mapping[str, float | None]) -> tuple[int, dict[str, float]]:
    """``(step, scalars)`` of one ``metrics.jsonl`` line: the step is its ``iteration``;
    the scalars are the other keys with a value (nulls skipped).

    Raises:
        ContractError: the line has no integral ``iteration``.
    """

    it = line.get("iteration")
    if it is None or float(it) != int(it):
        raise ContractError(f"metrics line without an integral 'iteration' ({it!r}); keys {sorted(line)[:8]}")
    return int(it), {k: float(v) for k, v in line.items() if k != "iteration" and v is not None}


class TensorBoardSink:
    """TensorBoard scalars under ``log_dir`` (module docstring); ``history`` is written first."""

    name = "tensorboard"

    def __init__(self, log_dir: Path, history: Sequence[Mapping[str, float | None]]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError(f"logging.tensorboard=true needs the tensorboard package ({exc}); "
                              "install it with: pip install 'agentrl[tensorboard]'") from None
        if log_dir.exists():
            shutil.rmtree(log_dir)  # earlier attempts' events: rewritten from the history below
        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=1)
        for line in history:
            self.write(*scalars_of(line))

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()  # one iteration at a time: a crash loses nothing written before it

    def close(self) -> None:
        self._writer.close()


def wandb_run_id(run_id: str, mode: str, iterations_done: int) -> str:
    """The W&B run id of this attempt (module docstring): the run id offline, or online for
    a run's first attempt; ``RUN_ID-resume-N`` online after a resume from iteration N."""
    return run_id if mode == "offline" or iterations_done == 0 else f"{run_id}-resume-{iterations_done}"


class WandbSink:
    """A W&B run (module docstring); ``history`` is logged first.

    Args:
        root: the run directory; W&B writes under ``root/wandb``.
        settings: ``logging.wandb`` (``project``, ``mode``, ``entity``, ``tags``).
        run_id, run_name: the agentrl run's id and name.
        config: the run's config, stored as the W&B run's config.
        history: the lines of the iterations already done (the checkpoint's).
    """

    name = "wandb"

    def __init__(self, root: Path, settings: Any, run_id: str, run_name: str, config: Mapping[str, Any],
                 history: Sequence[Mapping[str, float | None]]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError(f"logging.wandb needs the wandb package ({exc}); "
                              "install it with: pip install 'agentrl[wandb]'") from None
        out = root / WANDB_DIR
        if settings.mode == "offline" and out.is_dir():
            for old in out.glob(f"offline-run-*-{run_id}"):  # earlier attempts: logged again below
                shutil.rmtree(old, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        wid = wandb_run_id(run_id, settings.mode, len(history))
        self._excepthook = sys.excepthook  # wandb.init installs its own; close() puts this one back
        try:
            self._run = wandb.init(
                project=settings.project, entity=settings.entity, mode=settings.mode, dir=str(root), id=wid,
                name=run_name, group=run_id, tags=list(settings.tags), config=dict(config),
                # no system-metric sampler, console capture or code snapshot: on 2 cores they cost
                # CPU, and they are not metrics.jsonl's
                settings=wandb.Settings(x_disable_stats=True, console="off", save_code=False, silent=True,
                                        x_save_requirements=False, disable_git=True),
            )
        except Exception as exc:  # no login, no network, a bad entity: before the run starts, in one line
            sys.excepthook = self._excepthook
            raise InfraError(f"logging.wandb (mode={settings.mode!r}, project={settings.project!r}): W&B could not "
                             f"start a run: {type(exc).__name__}: {exc}; `wandb login` for online mode, or "
                             "logging.wandb.mode=offline to log without a network") from exc
        for line in history:
            self.write(*scalars_of(line))

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        import wandb

        self._run.finish()
        # finish() can return before W&B's core process has written the offline run's .wandb
        # file (seen: only its 7-byte header a moment later); teardown waits for that process
        wandb.teardown()
        sys.excepthook = self._excepthook


class Sinks:
    """The sinks of one run: ``write(line)`` hands a metrics line to each; a sink that raises
    is logged once and dropped (module docstring)."""

    def __init__(self, sinks: Sequence[MetricSink] = ()) -> None:
        self.sinks = list(sinks)

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def write(self, line: Mapping[str, float | None]) -> None:
        if not self.sinks:
            return
        step, scalars = scalars_of(line)
        for sink in list(self.sinks):
            try:
                sink.write(step, scalars)
            except Exception as exc:
                log.warning("metric sink %s failed at iteration %d and is switched off (metrics.jsonl "
                            "and the replay store keep every line): %s", sink.name, step, exc)
                self.sinks.remove(sink)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                log.warning("metric sink %s failed to close: %s", sink.name, exc)
        self.sinks = []


def check_packages(cfg: Any) -> None:
    """Start-up check, before anything heavy starts: the packages of the sinks ``cfg.logging``
    asks for are installed (``importlib.util.find_spec``, nothing imported).

    Raises:
        ConfigError: one is missing; the message names the extra to install.
    """
    import importlib.util

    wanted = [("logging.tensorboard=true", "tensorboard", "tensorboard")] if cfg.logging.tensorboard else []
    if cfg.logging.wandb is not None:
        wanted.append(("logging.wandb", "wandb", "wandb"))
    for what, module, extra in wanted:
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"{what} needs the {module} package, which is not installed; "
                              f"install it with: pip install 'agentrl[{extra}]'")


def open_sinks(cfg: Any, run_dir: Path, run_id: str, history: Sequence[Mapping[str, float | None]]) -> Sinks:
    """The sinks ``cfg.logging`` asks for, rebuilt from ``history`` (the checkpoint's lines;
    ``[]`` for a new run). Call after ``RunDir.rewind``.

    Raises:
        ConfigError: a sink's package is not installed (the extra to install named).
    """
    sinks: list[MetricSink] = []
    try:
        if cfg.logging.tensorboard:
            sinks.append(TensorBoardSink(Path(run_dir) / TENSORBOARD_DIR, history))
        if cfg.logging.wandb is not None:
            sinks.append(WandbSink(Path(run_dir), cfg.logging.wandb, run_id, cfg.run.name,
                                   cfg.model_dump(mode="json"), history))
    except BaseException:
        Sinks(sinks).close()
        raise
    return Sinks(sinks)
