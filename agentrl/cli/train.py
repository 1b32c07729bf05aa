"""``agentrl train`` and ``agentrl export``: a training run with its progress bar and summary
table, and a checkpoint written as a Hugging Face folder."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import typer
import typer.core
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentrl.errors import AgentRLError

from agentrl.cli.app import app, console, DEBUG_HELP, say, fail


class RunProgress:
    """Adapter the controller drives: a rich progress bar with the current phase. ``log_path``:
    the run's console log (``agentrl.logs``), opened when the run starts (its directory is
    written by then)."""

    def __init__(self, progress: Progress, log_path: Optional[Path] = None) -> None:
        self.p = progress
        self.task: Any = None
        self.log_path = log_path

    def start(self, total: int, completed: int) -> None:
        if self.log_path is not None:
            from agentrl.logs import attach_log_file

            attach_log_file(self.log_path)
        self.task = self.p.add_task("starting", total=total, completed=completed)

    def phase(self, it: int, name: str) -> None:
        """Iteration ``it`` (1-based, as every iteration the user sees) is in phase ``name``."""
        self.p.update(self.task, description=f"iteration {it}: {name}")

    def advance(self, it: int, m: dict) -> None:
        r = m.get("rollout/reward_mean")
        self.p.update(self.task, advance=1, description=f"iteration {it} done, reward {r if r is None else round(r, 3)}")


def keep_console_log(log_path: Optional[Path]) -> None:
    """A run that ended before its progress bar started (e.g. an engine that would not
    start): its console log still goes to ``log_path`` once its run directory was written."""
    from agentrl.logs import attach_log_file, console_log

    log = console_log()
    if log_path is not None and log is not None and log.path is None and (log_path.parent / "config.yaml").is_file():
        attach_log_file(log_path)


def summary_table(summary: Any) -> Table:
    t = Table(title=f"run {summary.run_id}: {summary.status}", show_lines=False,
              caption="gen/train: tokens generated/trained; lp gap: mean |engine - trainer| log-prob")
    cols = [("it", "iteration", "{:.0f}"), ("reward", "rollout/reward_mean", "{:.3f}"),
            ("succ", "rollout/success_rate", "{:.2f}"), ("gen", "tokens/generated", "{:.0f}"),
            ("train", "tokens/trained", "{:.0f}"), ("roll s", "time/rollout_s", "{:.0f}"),
            ("upd s", "time/update_s", "{:.0f}"), ("sync s", "time/sync_s", "{:.1f}"),
            ("lp gap", "rollout_corr/gap_abs_mean", "{:.0e}")]
    if any(row.get("eval/pass@1") is not None for row in summary.history):  # eval.every: held-out pass@1 beside train
        cols.append(("eval pass@1", "eval/pass@1", "{:.3f}"))
    for name, _, _ in cols:
        t.add_column(name, justify="right")
    for row in summary.history:
        t.add_row(*[(fmt.format(row[k]) if row.get(k) is not None else "-") for _, k, fmt in cols])
    return t


@app.command()
def train(
    config: Optional[Path] = typer.Argument(None, help="YAML config (default: the embedded CPU default shipped in the package, agentrl/defaults/shell_lookup.yaml; examples/shell_lookup.yaml is a copy to edit; examples/humaneval.yaml runs HumanEval)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key.sub=value overrides, e.g. run.iterations=5 rollout.max_turns=2."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the run in this run directory from its latest checkpoint."),
    address: Optional[str] = typer.Option(None, "--address", help="Join an existing Ray cluster at this address instead of starting one."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Train a policy: rollouts in sandboxed environments → advantages → FSDP2 update → weight sync."""
    from agentrl.driver.controller import load_run_config, train as run_train
    from agentrl.config import load_config, load_default_config
    from agentrl.logs import LOG_FILE_NAME, setup_console

    setup_console(debug)  # known-harmless vLLM/Ray warnings off the terminal, all lines in RUN_DIR/console.log
    ov = list(overrides or [])
    if config is not None and "=" in str(config) and not config.exists():
        ov.insert(0, str(config))  # first positional was an override, not a file
        config = None
    cfg = None
    log_path: Optional[Path] = None
    try:
        if resume is not None:
            if config is not None:
                raise AgentRLError("--resume reads the run's own config.yaml; pass overrides only (e.g. run.iterations=6)")
            cfg = load_run_config(resume, ov)
        else:
            cfg = load_config(config, ov) if config is not None else load_default_config(ov)
            from agentrl.driver.checkpoint import RunDir
            from agentrl.errors import ConfigError

            if RunDir(cfg.run_dir()).holds_run():  # the command line's own words for what train() refuses
                raise ConfigError(f"run directory {cfg.run_dir()} already holds a run; continue it with "
                                  f"`agentrl train --resume {cfg.run_dir()}`, or choose another run.name / run.dir")
        if address:
            cfg.cluster.address = address
        log_path = Path(resume if resume is not None else cfg.run_dir()) / LOG_FILE_NAME
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as p:
            summary = run_train(cfg, resume=resume is not None, progress=RunProgress(p, log_path))
    except AgentRLError as exc:
        fail(exc, debug)
        return
    except KeyboardInterrupt:
        run_dir = resume if resume is not None else (cfg.run_dir() if cfg is not None else "RUN_DIR")
        say("interrupted:", f"the latest checkpoint is kept; continue with `agentrl train --resume {run_dir}` "
                             "(add run.iterations=N to run more)", "yellow")
        raise typer.Exit(130)
    finally:
        keep_console_log(log_path)
    from agentrl.eval.report import training_eval_lines

    Console().print(summary_table(summary))
    say("", f"run directory: {summary.run_dir}  (metrics.jsonl, replay.db, checkpoints/, {LOG_FILE_NAME}: "
             "every warning, the known-harmless ones that were not shown included)")
    from agentrl.driver.judge import eval_llm_judge, judge_label, judge_name

    judge = None
    if training_eval_lines(summary.history):  # an eval ran: name the judge that scored it
        j = cfg.reward.judge
        judge = judge_label(cfg.env.id, cfg.env.kwargs, cfg.env.import_modules, llm_judge=judge_name(j),
                            eval_judge=eval_llm_judge(cfg, j))
    for line in training_eval_lines(summary.history, judge=judge):  # eval.before_training / after_training: the last lines
        typer.echo(line)


def export_report(report: Any) -> Table:
    """The files ``agentrl export`` wrote, then what they hold and the check's result."""
    t = Table("file", "bytes", title=f"exported {report.out_dir}",
              caption=f"{report.num_params:,} parameters stored, {report.dtype}")
    for name, size in report.files:
        t.add_row(name, f"{size:,}")
    return t


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="Run directory written by `agentrl train` (config.yaml, checkpoints/)."),
    out_dir: Path = typer.Argument(..., help="Folder to write the Hugging Face model to; it must not exist yet (see --force)."),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="Checkpoint to export, by name (e.g. iter_3); default: the latest complete one."),
    force: bool = typer.Option(False, "--force", help="Replace OUT_DIR when it is an earlier export or an empty folder; any other folder is never deleted."),
    dtype: str = typer.Option("float32", "--dtype", help="Weights written: float32 (the trainer's master weights) or bfloat16 (half the size; the round-trip check then runs on fp32 before the cast, and the cast is checked exact)."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Write a run's checkpoint as a plain Hugging Face folder (safetensors, config, tokenizer,
    chat template, generation config) that transformers and vLLM load. Before the folder is
    moved into place, log-probs of a fixed batch computed from it with plain transformers
    must equal the trainer's within 1e-6 (fp32) and tied weights must be stored once and tied
    again on reload. Exit 0 when written, 1 when the check fails (nothing is written), 2 on a
    user error."""
    from agentrl.commands.export import ExportCheckError, export_run, prepare_export

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        req = prepare_export(run_dir, out_dir, checkpoint=checkpoint, force=force, dtype=dtype)
        if not debug:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        with console.status(f"exporting {req.checkpoint}") as status:
            report = export_run(req, progress=lambda phase: status.update(f"{req.checkpoint.name}: {phase}"))
    except ExportCheckError as exc:
        if debug:
            raise
        say("export check failed:", str(exc))
        raise typer.Exit(1)
    except AgentRLError as exc:
        fail(exc, debug)
        return
    Console().print(export_report(report))
    tied = ", ".join(f"{t} tied to {s}" for t, s in report.tied.items())
    typer.echo(f"from: {report.checkpoint} of run {report.run_id} (policy version {report.policy_version}, "
               f"trainer step {report.global_step})")
    typer.echo(f"tied weights: {tied + ', stored once and tied again on reload' if tied else 'none'}")
    cast = "; bf16 weights equal the checked fp32 weights rounded to bf16" if report.bf16_cast_exact else ""
    typer.echo(f"round trip: max |trainer - exported| log-prob {report.max_abs_diff:.2g} nats over {report.tokens} "
               f"tokens of {report.rows} rows (allowed {report.tolerance:g}, fp32, temperature "
               f"{report.temperature:g}): passed{cast}")
    typer.echo(f"load it: AutoModelForCausalLM.from_pretrained({str(report.out_dir)!r}) or vllm.LLM(model=...)"
               f"  ({report.seconds:.1f} s)")

