"""Regenerates the screenshots of ``agentrl view`` in docs/viewer.md (examples/viewer/*.png) from a
real run: the run page and the page of one episode, taken by Playwright in Debian's
Chromium (headless; scripts/install.sh installs it with AGENTRL_INSTALL_TEST_DEPS=1).

    .venv/bin/python scripts/viewer_screenshots.py                 # trains a small run first
    .venv/bin/python scripts/viewer_screenshots.py --run-dir runs/humaneval-smollm2

Without ``--run-dir`` it trains ``--iterations`` iterations of the tiny test model on
``agentrl/ShellTasks-v0`` (bubblewrap sandbox, GiGPO; the same set-up as the viewer's
browser tests, tests/integration/viewer/real_runs.py) with ``agentrl train`` into a
temporary folder (a few minutes on 2 cores), then serves it with ``agentrl view``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode
from urllib.request import urlopen

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("AGENTRL_TEST_CHROMIUM", "/usr/bin/chromium")


def _train(workdir: Path, iterations: int) -> Path:
    sys.path.insert(0, str(REPO))
    from agentrl.model_zoo import prepare_model
    from tests.integration.viewer.real_runs import run_overrides

    run_dir = workdir / "run"
    overrides = run_overrides(run_dir, str(prepare_model("tiny-random-smollm2")), f"sqlite:///{run_dir / 'replay.db'}",
                              "shelltasks-tiny")
    overrides = [o for o in overrides if not o.startswith(("run.iterations=", "replay.url="))]
    overrides += [f"run.iterations={iterations}", "rollout.max_new_tokens=48"]
    print(f"[screenshots] agentrl train {' '.join(overrides)}", flush=True)
    subprocess.run([sys.executable, "-m", "agentrl.cli", "train", *overrides], cwd=REPO, check=True)
    return run_dir


def _serve(target: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "view", str(target), "--port", str(port)], cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urlopen(base + "/", timeout=10):
                return proc, base
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"agentrl view {target} did not start")
            time.sleep(0.3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", type=Path, help="an existing run directory (default: train a small run)")
    p.add_argument("--iterations", type=int, default=4, help="iterations of the trained run")
    p.add_argument("--out", type=Path, default=REPO / "examples" / "viewer", help="folder of the PNG files")
    args = p.parse_args()

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="viewer_screens_") as tmp:
        run_dir = args.run_dir or _train(Path(tmp), args.iterations)
        proc, base = _serve(run_dir)
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(60_000)
                page.goto(base + "/")
                run_id = page.get_by_test_id("run-row").first.get_attribute("data-run-id")
                page.goto(base + "/run?" + urlencode({"id": run_id}))
                page.screenshot(path=str(args.out / "run-page.png"), full_page=True)
                # the episode with the most turns, so the transcript shows tool calls
                page.goto(base + "/episodes?" + urlencode({"run": run_id, "sort": "turns", "desc": "true"}))
                page.get_by_test_id("episode-link").first.click()
                page.wait_for_url("**/episode?*")
                page.locator('[data-testid="token"][data-loss-mask="1"]').first.hover()
                height = min(2400, page.evaluate("() => document.documentElement.scrollHeight"))
                page.screenshot(path=str(args.out / "episode-page.png"),
                                clip={"x": 0, "y": 0, "width": 1280, "height": height}, full_page=True)
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    for name in ("run-page.png", "episode-page.png"):
        print(f"[screenshots] wrote {args.out / name}")


if __name__ == "__main__":
    main()
