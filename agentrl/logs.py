"""The console of a command: known-harmless warnings of vLLM, Ray, PyTorch and transformers
are kept off the terminal, and every line the command's loggers and Ray workers print
(hidden or shown) goes to a log file.

``KNOWN_HARMLESS`` lists each hidden message by an exact pattern, with why it is harmless in
agentrl's set-up (vLLM's CPU platform notices, settings agentrl chose on purpose, model
loading progress bars, deprecations inside vLLM). Nothing else is hidden: a warning that is
not on the list, an error, a traceback, reach the terminal as before.

Where lines come from and how they are filtered:

- the driver's Python logging: the handler of ``logging.basicConfig`` and Ray's own handler
  on the ``ray`` logger (``filter_ray_logger``, called by ``agentrl.cluster.actors.ray_connect.connect``
  before ``ray.init``) get a ``ConsoleFilter``; Python warnings are routed through logging
  (``logging.captureWarnings``) so they take the same path;
- the Ray actors (vLLM engines, trainer ranks): Ray forwards their stdout and stderr to the
  driver (``ray.init(log_to_driver=True)``), where ``filter_worker_logs`` (called by
  ``connect`` after ``ray.init``) filters each forwarded line before Ray prints it. A hidden
  line's continuation (the source line Python's ``warnings`` prints under a warning, the
  blank line a progress bar ends with) is hidden with it. The patterns are searched in the
  lines as the actors print them, so they apply on a joined cluster too.

``--debug`` (``setup_console(debug=True)``) hides nothing. The log file
(``attach_log_file``: ``RUN_DIR/console.log`` for ``agentrl train``, ``<eval dir>/console.log``
for ``agentrl eval`` and ``agentrl tasks profile``) is appended to, one line per console line,
each marked ``shown`` or ``hidden <name>``; lines printed before the file is known are kept
in memory (the first ``MAX_BUFFERED_LINES``) and written when it is attached.

Example::

    setup_console(debug=False)          # the CLI, before anything logs
    ...                                 # ray_connect.connect -> filter_worker_logs()
    attach_log_file(run_dir / "console.log")
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

__all__ = ["KNOWN_HARMLESS", "LOG_FILE_NAME", "ConsoleFilter", "ConsoleLog", "KnownWarning", "attach_log_file",
           "console_log", "filter_ray_logger", "filter_worker_logs", "known_harmless", "setup_console"]

LOG_FILE_NAME = "console.log"
"""The log file's name in a run directory (``agentrl train``) or an eval directory."""

MAX_BUFFERED_LINES = 20_000
"""Lines kept in memory before ``attach_log_file``; later ones before it are counted, not kept."""


@dataclass(frozen=True)
class KnownWarning:
    """One known-harmless console message.

    Attributes:
        name: short id, written beside each hidden line in the log file.
        pattern: regular expression searched in the line (the message's own words, so the
            logger's prefix, the process id and the time do not matter).
        why: why it is harmless where agentrl runs it.
    """

    name: str
    pattern: re.Pattern[str]
    why: str


def _known(name: str, pattern: str, why: str) -> KnownWarning:
    return KnownWarning(name, re.compile(pattern), why)


KNOWN_HARMLESS: tuple[KnownWarning, ...] = (
    # Ray, in the driver
    _known("ray-token-auth-enabled",
           r"Token authentication is enabled for this Ray cluster\. Set RAY_AUTH_MODE=disabled to opt out\.",
           "Ray's notice that the local instance it started uses token authentication (its default)."),
    _known("ray-init-again", r"Calling ray\.init\(\) again after it has already been called\.",
           "an in-process caller (a test, a notebook) initialised Ray first; agentrl uses that instance."),
    # vLLM engine start-up in a rollout actor: the CPU platform and settings agentrl chose on purpose
    _known("vllm-dist-ident-env", r"Unknown vLLM environment variable detected: VLLM_DIST_IDENT",
           "vLLM's CPU worker sets VLLM_DIST_IDENT in its own process (vllm/v1/worker/cpu_worker.py); an "
           "engine started later in the same process (an eval engine after another one) sees it and warns."),
    _known("vllm-global-seed", r"The global random seed is set to \d+\. Since VLLM_ENABLE_V1_MULTIPROCESSING is set "
                               r"to False, this may affect the random state",
           "agentrl runs the engine in-process on purpose; every request carries its own sampling seed."),
    _known("vllm-chunked-prefill", r"This model does not officially support disabling chunked prefill\.",
           "agentrl disables chunked prefill on purpose (whole prompts, exact log-probs)."),
    _known("vllm-batched-tokens", r"max_num_batched_tokens \(\d+\) exceeds max_num_seqs \* max_model_len \(\d+\)\.",
           "agentrl sets max_num_batched_tokens to at least 8192; a budget above what the sequences can use is idle."),
    _known("vllm-enforce-eager", r"Enforce eager set, disabling torch\.compile, CUDAGraphs",
           "agentrl runs vLLM eagerly on purpose (enforce_eager)."),
    _known("vllm-inductor-off", r"Inductor compilation was disabled by user settings",
           "follows from enforce_eager."),
    _known("vllm-no-triton-cpu", r"Triton is not installed\. triton-cpu is expected on x86 CPUs\.",
           "vLLM's CPU build runs without Triton."),
    _known("torch-triton-no-cpu", r"Triton is installed, but doesn't include CPU backend\. Disabling Triton\.",
           "vLLM's CPU build runs without Triton."),
    _known("vllm-model-runner-v1", r"Model Runner V2 requires Triton; using the V1 model runner instead\.",
           "the CPU build's model runner."),
    _known("vllm-ld-preload", r"(libtcmalloc|libiomp) is not found in LD_PRELOAD\.",
           "a performance tip of vLLM's CPU build; the engine works without them."),
    _known("vllm-omp-threads", r"OMP_NUM_THREADS=\d+ is set; leaving Torch threads at \d+ for serving\.",
           "agentrl sets OMP_NUM_THREADS for each actor on purpose."),
    _known("vllm-set-num-threads", r"CPU backend doesn't allow to use `torch\.set_num_threads` after the thread binding",
           "vLLM's CPU worker keeps its own thread binding (OMP_NUM_THREADS, set by agentrl)."),
    _known("vllm-raw-prompts", r"Passing raw prompts to InputProcessor is deprecated",
           "a deprecation inside vLLM; agentrl passes token ids, which this vLLM version supports."),
    _known("vllm-no-tokenizer-eos", r"Using None for EOS token id because tokenizer is not initialized",
           "agentrl starts vLLM without its tokenizer (skip_tokenizer_init) and passes the stop token ids itself."),
    _known("vllm-ssm-cache-no-mamba", r"Reset SSM cache type to float32 for accelerated GDN mamba backend 'none'\.",
           "on a CPU with AVX-512 BF16 vLLM's CPU platform sets the SSM (mamba) state cache to float32; backend "
           "'none' means the model has no mamba layers, so there is no such cache (vllm/platforms/cpu.py)."),
    _known("vllm-numa-membind", r"Warning: NUMA binding: Using MEMBIND policy for memory allocation",
           "vLLM's CPU build binds memory to the NUMA node of its threads."),
    _known("torch-reduce-op-deprecated", r"FutureWarning: `torch\.distributed\.reduce_op` is deprecated",
           "a deprecation inside vLLM's Triton dispatcher."),
    _known("vllm-rotary-reload", r"RotaryEmbedding: Failed to load weights",
           "at a weight sync through vLLM's reload_weights the rotary embedding has no weights to load "
           "(its cos/sin cache is computed, not stored)."),
    # model loading progress bars
    _known("vllm-loading-shards", r"Loading safetensors checkpoint shards:",
           "vLLM's progress bar while an engine loads its model."),
    _known("hf-loading-weights", r"^\s*Loading weights:",
           "transformers' progress bar while a trainer rank loads its model."),
    # the trainer
    _known("torch-lr-scheduler-order", r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`",
           "the trainer steps the scheduler also when an update is skipped (no signal or a non-finite gradient), "
           "so the schedule follows the updates counted, as intended."),
)
"""The hidden messages (module docstring); ``--debug`` shows them."""


def known_harmless(line: str) -> KnownWarning | None:
    """The ``KNOWN_HARMLESS`` entry ``line`` matches, or None."""
    for k in KNOWN_HARMLESS:
        if k.pattern.search(line):
            return k
    return None


class ConsoleLog:
    """Decides which console lines are shown and writes every line to the log file.

    Args:
        debug: show every line (nothing hidden); the log file is written all the same.
    """

    def __init__(self, debug: bool = False) -> None:
        self.debug = debug
        self.path: Path | None = None
        self._file: TextIO | None = None
        self._buffer: list[str] = []
        self._dropped = 0
        self._lock = threading.Lock()
        self._continuing: dict[Any, bool] = {}  # per worker stream: the last line was hidden
        self.hidden = 0  # lines hidden so far (all sources)

    # -- the log file -------------------------------------------------------------------
    def _write(self, text: str) -> None:
        with self._lock:
            if self._file is not None:
                self._file.write(text + "\n")
                self._file.flush()
            elif len(self._buffer) < MAX_BUFFERED_LINES:
                self._buffer.append(text)
            else:
                self._dropped += 1

    def record(self, line: str, where: str, hidden_as: KnownWarning | str | None) -> None:
        """Write one console line to the log file (or the buffer before ``attach``)."""
        mark = "shown" if hidden_as is None else f"hidden {getattr(hidden_as, 'name', hidden_as)}"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._write(f"{stamp} [{mark}] {where}{line}")

    def attach(self, path: str | Path) -> Path:
        """Append to ``path`` from now on (its folder is created); the lines buffered so far
        are written first. A second call with another path switches files."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the command's life
        with self._lock:
            old, self._file, self.path = self._file, f, path
            buffered, self._buffer = self._buffer, []
            dropped, self._dropped = self._dropped, 0
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n")
            for text in buffered:
                f.write(text + "\n")
            if dropped:
                f.write(f"({dropped} more lines before this file was opened were not kept)\n")
            f.flush()
        if old is not None:
            old.close()
        return path

    def close(self) -> None:
        with self._lock:
            f, self._file = self._file, None
        if f is not None:
            f.close()

    # -- filtering ----------------------------------------------------------------------
    def hide_record(self, text: str, where: str = "") -> bool:
        """Record one driver log line; True when it is hidden from the terminal."""
        match = None if self.debug else known_harmless(text)
        self.record(text, where, match)
        if match is not None:
            self.hidden += 1
        return match is not None

    def worker_lines(self, source: Any, lines: list[str], where: str = "") -> list[str]:
        """Record the lines one worker stream (``source``: e.g. ``(ip, pid, is_err)``) printed;
        returns the ones to show. A blank or indented line right after a hidden line of the
        same stream is hidden with it (module docstring)."""
        shown = []
        for line in lines:
            match: KnownWarning | str | None = None
            if not self.debug:
                match = known_harmless(line)
                if match is None and self._continuing.get(source) and (not line.strip() or line[:1].isspace()):
                    match = "continuation"
            self.record(line, where, match)
            self._continuing[source] = match is not None
            if match is None:
                shown.append(line)
            else:
                self.hidden += 1
        return shown


class ConsoleFilter(logging.Filter):
    """A handler filter: records every log record it sees to the ``ConsoleLog`` and drops
    the known-harmless ones (``known_harmless``) unless in debug mode."""

    def __init__(self, log: ConsoleLog) -> None:
        super().__init__()
        self.log = log

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is the handler's to report
            return True
        return not self.log.hide_record(text, f"{record.levelname} {record.name}: ")


_console: ConsoleLog | None = None


def console_log() -> ConsoleLog | None:
    """The command's ``ConsoleLog`` (``setup_console``), None when no command set one up
    (e.g. a library caller or a test calling ``train`` directly: nothing is filtered)."""
    return _console


def _add_filter(handler: logging.Handler, log: ConsoleLog) -> None:
    for f in list(handler.filters):
        if isinstance(f, ConsoleFilter):
            handler.removeFilter(f)
    handler.addFilter(ConsoleFilter(log))


def setup_console(debug: bool = False) -> ConsoleLog:
    """Set up the command's logging (``logging.basicConfig`` at WARNING, DEBUG with
    ``debug``), the console filter on its handler and on Ray's, and Python warnings through
    logging. Returns the ``ConsoleLog`` (also ``console_log()``)."""
    global _console
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)
    old = _console
    _console = ConsoleLog(debug=debug)
    if old is not None:
        old.close()
    for h in logging.getLogger().handlers:
        _add_filter(h, _console)
    filter_ray_logger()
    return _console


def filter_ray_logger() -> None:
    """The console filter on Ray's handler of the ``ray`` logger (which does not propagate),
    once Ray is imported (``agentrl.cluster.actors.ray_connect.connect`` calls it before ``ray.init``,
    which logs through it); nothing when no command set up the console."""
    if _console is None or "ray" not in sys.modules:
        return
    for h in logging.getLogger("ray").handlers:
        _add_filter(h, _console)


def attach_log_file(path: str | Path) -> Path | None:
    """Write the console log to ``path`` (``ConsoleLog.attach``); None (nothing done) when
    no command set up the console."""
    return _console.attach(path) if _console is not None else None


def filter_worker_logs() -> bool:
    """Put the console filter between Ray's forwarding of its workers' stdout/stderr and the
    driver's terminal (after ``ray.init(log_to_driver=True)``). Returns False when no
    command set up the console, or this Ray version has no forwarding handler to wrap (then
    nothing changes); True when installed (or already in place)."""
    filter_ray_logger()  # Ray's logger handler may be (re)made by ray.init
    if _console is None:
        return False
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return False
    with dispatcher._lock:
        handlers = list(dispatcher.handlers)
    printing = [(name, h) for name, h in handlers if name == "ray_print_logs"]
    if not printing:
        return False
    name, handler = printing[-1]
    if getattr(handler, "_agentrl_console", False):
        return True
    log = _console

    def filtered(data: dict[str, Any], _print: Callable[[dict[str, Any]], None] = handler) -> None:
        lines = list(data.get("lines") or [])
        pid = data.get("pid")
        who = data.get("actor_name") or data.get("task_name") or ""
        where = f"({who + ' ' if who else ''}pid={pid}{', stderr' if data.get('is_err') else ''}) "
        if pid == "autoscaler":  # Ray's status dumps: Ray prints only its events of them; not recorded
            _print(data)
            return
        if pid == "raylet":  # Ray's own node messages: recorded, never hidden
            for line in lines:
                log.record(line, where, None)
            _print(data)
            return
        shown = log.worker_lines((data.get("ip"), pid, bool(data.get("is_err"))), lines, where)
        if shown:
            _print(dict(data, lines=shown))

    filtered._agentrl_console = True  # type: ignore[attr-defined]
    dispatcher.remove_handler(name)  # ray.shutdown() removes the handler by this name
    dispatcher.add_handler(name, filtered)
    return True
