"""The console filter (``agentrl.logs``): the known-harmless lines that ``agentrl train`` and
``agentrl eval`` printed before the first useful line (captured from real runs with the tiny
model and with SmolLM2 on this machine) are hidden, each by its own ``KNOWN_HARMLESS``
entry, and written to the log file; anything else (agentrl's own warnings, vLLM warnings
not on the list, errors, tracebacks) is shown. Through a real ``logging`` handler and
Ray's real forwarding dispatcher (``ray_logging.WorkerStandardStreamDispatcher``); the
whole command is ``tests/integration/test_cli_console.py``."""

from __future__ import annotations

import io
import logging

import pytest

from agentrl import logs

# Ray's log forwarding hands the driver each actor line without the "(RolloutActor pid=...)" prefix.
CAPTURED_ACTOR_STDOUT = [
    "(MainProcess pid=17789) WARNING 12-06 05:46:43 [arg_utils.py:1945] The global random seed is set to 0. Since "
    "VLLM_ENABLE_V1_MULTIPROCESSING is set to False, this may affect the random state of the Python process that "
    "launched vLLM.",
    "(MainProcess pid=17789) WARNING 12-06 05:46:53 [arg_utils.py:3005] This model does not officially support "
    "disabling chunked prefill. Disabling this manually may cause the engine to crash or produce incorrect outputs.",
    "(MainProcess pid=17789) WARNING 12-06 05:46:53 [scheduler.py:345] max_num_batched_tokens (8192) exceeds "
    "max_num_seqs * max_model_len (4096). This may lead to unexpected behavior.",
    "(MainProcess pid=17789) WARNING 12-06 05:46:53 [vllm.py:1703] Enforce eager set, disabling torch.compile, "
    "CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and "
    "--kernel_config.enable_jit_warmup=False",
    "(MainProcess pid=17789) WARNING 12-06 05:46:53 [vllm.py:1727] Inductor compilation was disabled by user "
    "settings, optimizations settings that are only active during inductor compilation will be ignored.",
    "(MainProcess pid=17789) WARNING 12-06 05:46:53 [cpu.py:224] Triton is not installed. triton-cpu is expected on "
    "x86 CPUs.",
    "(MainProcess pid=17789) WARNING 12-06 05:46:53 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model "
    "runner instead.",
    "(MainProcess pid=17789) WARNING 12-06 05:46:54 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For "
    "best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/"
    "installation/cpu/ to setup required pre-loaded libraries.",
    "(MainProcess pid=17789) WARNING 12-06 05:46:54 [cpu_worker.py:114] libiomp is not found in LD_PRELOAD. For best "
    "performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/"
    "installation/cpu/ to setup required pre-loaded libraries.",
    "(MainProcess pid=17789) WARNING 12-06 05:46:54 [torch_utils.py:283] OMP_NUM_THREADS=2 is set; leaving Torch "
    "threads at 2 for serving. Multi-threaded torch CPU ops during serving can degrade performance through spin-wait "
    "contention and cgroup CPU-quota throttling.",
    "(MainProcess pid=17789) WARNING 12-06 05:46:56 [cpu_worker.py:140] CPU backend doesn't allow to use "
    "`torch.set_num_threads` after the thread binding, skip it.",
    "(MainProcess pid=17789) WARNING 12-06 05:46:56 [input_processor.py:408] Passing raw prompts to InputProcessor is "
    "deprecated and will be removed in the future. You should instead pass the outputs of Renderer.render_cmpl() or "
    "Renderer.render_chat().",
    "(MainProcess pid=17789) WARNING 12-06 05:46:56 [base.py:413] Using None for EOS token id because tokenizer is "
    "not initialized",
    # only on a CPU with AVX-512 BF16 (the CI machine, 2026-12-07)
    "(MainProcess pid=9269) WARNING 12-07 07:19:17 [cpu.py:317] Reset SSM cache type to float32 for accelerated GDN "
    "mamba backend 'none'.",
]
CAPTURED_ACTOR_STDERR = [  # with the continuation lines (a warning's source line, a progress bar's last newline)
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "/work/main/.venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: "
    "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
    '  if hasattr(value, "__dict__"):',
    "[W1206 05:46:54.056246466 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on "
    "the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function init_cpu_memory_env)",
    "Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 37.57it/s]",
    "",
    "Loading weights:   0%|          | 0/20 [00:00<?, ?it/s]Loading weights: 100%|##########| 20/20 [00:00<00:00, "
    "1260.86it/s]",
    "/work/main/agentrl/trainer/_core.py:223: UserWarning: Detected call of `lr_scheduler.step()` before "
    "`optimizer.step()`. In PyTorch 1.1.0 and later, you should call them in the opposite order.",
    "  self.scheduler.step()",
    "(MainProcess pid=1) WARNING 12-06 05:46:56 [layerwise.py:266] RotaryEmbedding: Failed to load weights",
]
CAPTURED_DRIVER = [
    "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out. For more "
    "information, see https://docs.ray.io/en/latest/ray-security/token-auth.html",
]
USEFUL = [
    "(MainProcess pid=1) WARNING 12-06 05:47:00 [scheduler.py:1] Sequence group 0 is preempted by PreemptionMode."
    "RECOMPUTE mode because there is not enough KV cache space.",
    "(MainProcess pid=1) WARNING 12-06 05:47:00 [layerwise.py:266] LlamaAttention: Failed to load weights",
    "weight sync uses vLLM's reload_weights (slower): the CPU build has no in-place copy",
    "Traceback (most recent call last):",
    "Token authentication is disabled for this Ray cluster. Anyone with network access to the cluster can run "
    "arbitrary code and access its data.",
    "ERROR 12-06 05:47:00 [core.py:1] EngineCore failed to start.",
    # a model that has mamba layers: its state cache really changes dtype, so the line is shown
    "(MainProcess pid=1) WARNING 12-07 07:19:17 [cpu.py:317] Reset SSM cache type to float32 for accelerated GDN "
    "mamba backend 'gdn'.",
]


def test_every_captured_harmless_line_has_its_entry_and_useful_lines_have_none():
    for line in CAPTURED_ACTOR_STDOUT + CAPTURED_DRIVER:
        assert logs.known_harmless(line) is not None, line
    named = {logs.known_harmless(line).name for line in CAPTURED_ACTOR_STDERR if logs.known_harmless(line)}
    assert {"torch-triton-no-cpu", "torch-reduce-op-deprecated", "vllm-numa-membind", "vllm-loading-shards",
            "hf-loading-weights", "torch-lr-scheduler-order", "vllm-rotary-reload"} <= named
    for line in USEFUL:
        assert logs.known_harmless(line) is None, line
    assert len({k.name for k in logs.KNOWN_HARMLESS}) == len(logs.KNOWN_HARMLESS)
    assert all(k.why for k in logs.KNOWN_HARMLESS)


def test_worker_lines_hide_the_known_ones_with_their_continuations_and_log_all(tmp_path):
    log = logs.ConsoleLog()
    err = ("10.0.0.1", 17789, True)
    shown = log.worker_lines(err, CAPTURED_ACTOR_STDERR + ["Traceback (most recent call last):", '  File "x.py"'])
    assert shown == ["Traceback (most recent call last):", '  File "x.py"']  # an indented line after a shown one stays
    assert log.worker_lines(("10.0.0.1", 17789, False), CAPTURED_ACTOR_STDOUT + USEFUL[:1]) == USEFUL[:1]
    assert log.hidden == len(CAPTURED_ACTOR_STDERR) + len(CAPTURED_ACTOR_STDOUT)
    path = log.attach(tmp_path / "run" / logs.LOG_FILE_NAME)  # buffered lines go to the file on attach
    text = path.read_text()
    for line in CAPTURED_ACTOR_STDOUT + CAPTURED_ACTOR_STDERR + USEFUL[:1]:
        assert line in text
    assert text.count("[hidden ") == log.hidden and text.count("[shown] ") == 3
    assert log.worker_lines(err, ["  after attach"]) == ["  after attach"]  # the last line was shown
    log.close()
    assert "  after attach" in path.read_text()


def test_debug_hides_nothing_and_still_logs(tmp_path):
    log = logs.ConsoleLog(debug=True)
    log.attach(tmp_path / "console.log")
    assert log.worker_lines("s", CAPTURED_ACTOR_STDERR) == CAPTURED_ACTOR_STDERR
    log.close()
    assert (tmp_path / "console.log").read_text().count("[shown] ") == len(CAPTURED_ACTOR_STDERR)


@pytest.fixture
def fresh_console():
    """``setup_console`` changes process-wide logging: put the root handlers back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    for h in handlers:
        root.removeHandler(h)
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    logging.captureWarnings(False)
    if logs._console is not None:
        logs._console.close()
    logs._console = None


def test_driver_log_records_are_filtered_on_the_handler(tmp_path, fresh_console, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)  # basicConfig's handler writes to sys.stderr as it is now
    for h in list(logging.getLogger().handlers):  # pytest's capture handlers (added for the call): a CLI has none
        logging.getLogger().removeHandler(h)
    console = logs.setup_console(debug=False)
    logs.attach_log_file(tmp_path / "console.log")
    ray_like = logging.getLogger("ray._private.authentication.authentication_token_setup")
    ray_like.warning(CAPTURED_DRIVER[0])  # propagates to the root handler here (Ray's own handler: same filter)
    logging.getLogger("agentrl.driver.controller").warning("removed %d sandbox processes", 3)
    logging.getLogger("py.warnings").warning("x.py:1: FutureWarning: `torch.distributed.reduce_op` is deprecated")
    shown = stream.getvalue()  # (Python warnings reach "py.warnings": logging.captureWarnings)
    assert "Token authentication is enabled" not in shown and "reduce_op" not in shown
    assert "removed 3 sandbox processes" in shown
    console.close()
    text = (tmp_path / "console.log").read_text()
    assert "[hidden ray-token-auth-enabled]" in text and "[shown] WARNING agentrl.driver.controller: removed 3" in text


def test_ray_forwarded_lines_pass_the_filter_before_rays_printer(tmp_path, fresh_console):
    from ray._private.ray_logging import WorkerStandardStreamDispatcher

    import ray._private.ray_logging as ray_logging

    printed: list[dict] = []
    dispatcher = WorkerStandardStreamDispatcher()
    dispatcher.add_handler("ray_print_logs", printed.append)  # what ray.init(log_to_driver=True) adds
    real = ray_logging.global_worker_stdstream_dispatcher
    ray_logging.global_worker_stdstream_dispatcher = dispatcher
    try:
        assert logs.filter_worker_logs() is False  # no command set up the console: nothing changes
        logs.setup_console(debug=False)
        assert logs.filter_worker_logs() is True and logs.filter_worker_logs() is True  # wrapped once
        assert [name for name, _ in dispatcher.handlers] == ["ray_print_logs"]
        batch = {"ip": "10.0.0.1", "pid": 17789, "actor_name": "RolloutActor", "is_err": True, "job": "01000000",
                 "lines": CAPTURED_ACTOR_STDERR + USEFUL[1:2]}
        dispatcher.emit(batch)
        dispatcher.emit(dict(batch, lines=CAPTURED_ACTOR_STDOUT, is_err=False))  # all hidden: nothing printed
        dispatcher.emit({"ip": "10.0.0.1", "pid": "raylet", "is_err": True, "lines": ["(raylet) a node message"]})
        logs.attach_log_file(tmp_path / "console.log")
    finally:
        ray_logging.global_worker_stdstream_dispatcher = real
    assert [b["lines"] for b in printed] == [USEFUL[1:2], ["(raylet) a node message"]]
    assert printed[0]["actor_name"] == "RolloutActor" and printed[0]["pid"] == 17789
    text = (tmp_path / "console.log").read_text()
    assert "(RolloutActor pid=17789, stderr) Loading safetensors checkpoint shards:" in text
    assert "[shown] (pid=raylet, stderr) (raylet) a node message" in text
