"""Fixtures of the viewer tests.

HTTP-level tests (``test_viewer_pages.py`` and others): a replay database filled once per
module (``viewer_data.fill``: SQLite, and PostgreSQL when the suite has a server), and an HTTP
client of the viewer over it (read-only).

Browser tests (``test_viewer_browser.py``): replay databases written by real training runs
(``real_runs``, tests/integration/conftest.py: SQLite, and here the same rows copied into
PostgreSQL), ``agentrl view`` serving each of them, and Debian's Chromium driven headless by
Playwright.

The browser: ``/usr/bin/chromium`` (scripts/install.sh installs it when
``AGENTRL_INSTALL_TEST_DEPS=1``, which scripts/test.sh sets), launched through Playwright's
``executable_path`` because Playwright's own browser download is not reachable from these
machines; ``--no-sandbox`` since the tests run as root. With ``AGENTRL_REQUIRE_BROWSER=1``
(scripts/test.sh) a missing browser fails the tests instead of skipping them.

PostgreSQL: the server at ``$AGENTRL_TEST_POSTGRES_URL`` (started by scripts/test.sh); the
tests create a database of their own on it and drop it at the end. Without the variable the
PostgreSQL cases are skipped, unless ``AGENTRL_REQUIRE_POSTGRES=1``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.error import URLError
from urllib.parse import quote
from urllib.request import urlopen

import pytest
from fastapi.testclient import TestClient

from agentrl.replay import ReplayStore
from agentrl.replay.read import ReadOnlyDB
from agentrl.replay.viewer import create_app

from tests.integration.viewer.real_runs import RealRuns, copy_database
from tests.integration.viewer.viewer_data import fill

REPO = Path(__file__).resolve().parents[3]
CHROMIUM = os.environ.get("AGENTRL_TEST_CHROMIUM", "/usr/bin/chromium")
POSTGRES_ENV = "AGENTRL_TEST_POSTGRES_URL"
SERVE_TIMEOUT_S = 60.0


def _missing(what: str, env: str) -> None:
    if os.environ.get(env) == "1":
        pytest.fail(f"{env}=1 but {what}")
    pytest.skip(what)


@pytest.fixture(scope="session")
def postgres_copy(real_runs: RealRuns) -> Iterator[str]:
    """The URL of a fresh PostgreSQL database holding a copy of ``real_runs``' rows."""
    from tests.helpers.postgres_ctl import create_database, drop_database

    admin_url = os.environ.get(POSTGRES_ENV)
    if not admin_url:
        _missing(f"no PostgreSQL server: ${POSTGRES_ENV} is not set", "AGENTRL_REQUIRE_POSTGRES")
    try:
        url = create_database(admin_url, "agentrl_viewer")
    except Exception as exc:  # server down, bad credentials, missing driver
        _missing(f"PostgreSQL at ${POSTGRES_ENV} is not usable: {exc}", "AGENTRL_REQUIRE_POSTGRES")
    try:
        copy_database(real_runs.db_url, url)
        yield url
    finally:
        drop_database(admin_url, url)


# -- HTTP level: one filled database per module, a TestClient over it -------------------------

@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def viewer_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The URL of a database filled by ``fill`` (SQLite file, or a fresh PostgreSQL database)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('viewer') / 'replay.db'}"
    else:
        # a fresh database per module on the suite's server (tests/integration/conftest.py:
        # skipped without one, a failure under AGENTRL_REQUIRE_POSTGRES=1)
        url = request.getfixturevalue("postgres_module_url")
    store = ReplayStore(url)
    try:
        fill(store)
    finally:
        store.close()
    return url


@pytest.fixture(scope="module")
def viewer_db(viewer_db_url: str) -> Iterator[ReadOnlyDB]:
    db = ReadOnlyDB(viewer_db_url)
    yield db
    db.close()


@pytest.fixture(scope="module")
def client(viewer_db: ReadOnlyDB) -> Iterator[TestClient]:
    with TestClient(create_app(viewer_db, allowed_hosts=["testserver"])) as c:
        yield c


# -- browser: `agentrl view` over real runs, Chromium -------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ViewerServer:
    """``agentrl view DB_URL --port N`` in a subprocess (its own process group)."""

    def __init__(self, db_url: str, log_path: Path) -> None:
        self.db_url = db_url
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "wb")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        cmd = [sys.executable, "-m", "agentrl.cli", "view", db_url, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd,
                                     cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.log_path = log_path
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while True:
            try:
                with urlopen(self.base + "/", timeout=5) as r:
                    if r.status == 200:
                        return
            except (URLError, ConnectionError, TimeoutError, OSError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"agentrl view {db_url} did not answer on {self.base} "
                                   f"(exit {self.proc.returncode}):\n{self.output()[-3000:]}")
            time.sleep(0.2)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()



def serve_filled(fill_store, tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[ViewerServer]:
    """A module fixture's body: ``agentrl view`` over a fresh SQLite store that
    ``fill_store(url) -> url`` fills, stopped at the end (``yield from serve_filled(...)``)."""
    tmp = tmp_path_factory.mktemp(name)
    server = ViewerServer(fill_store(f"sqlite:///{tmp / 'replay.db'}"), tmp / "view.log")
    try:
        yield server
    finally:
        server.stop()

@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def viewer(request, real_runs: RealRuns, tmp_path_factory) -> Iterator[tuple[ViewerServer, RealRuns]]:
    """``agentrl view`` over the real runs, on SQLite and on the PostgreSQL copy."""
    url = real_runs.db_url if request.param == "sqlite" else request.getfixturevalue("postgres_copy")
    server = ViewerServer(url, tmp_path_factory.mktemp(f"view_{request.param}") / "view.log")
    try:
        # the first token view loads the run's tokenizer (seconds on a busy machine): here,
        # not inside a test's navigation timeout
        with urlopen(f"{server.base}/episode?id={quote(real_runs.xss_episode_id, safe='')}", timeout=120) as r:
            assert r.status == 200
        yield server, real_runs
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, through Playwright."""
    if not (os.path.isfile(CHROMIUM) or shutil.which(CHROMIUM)):
        _missing(f"no browser at {CHROMIUM}: run `AGENTRL_INSTALL_TEST_DEPS=1 scripts/install.sh`",
                 "AGENTRL_REQUIRE_BROWSER")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (the `test` extra)", "AGENTRL_REQUIRE_BROWSER")
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
    except Exception as exc:
        pw.stop()
        _missing(f"Chromium at {CHROMIUM} does not start: {exc}", "AGENTRL_REQUIRE_BROWSER")
    try:
        yield b
    finally:
        b.close()
        pw.stop()


@pytest.fixture
def page(browser):
    """A fresh page; dialogs opened by the page are recorded in ``page.dialogs`` (and
    dismissed), uncaught page errors in ``page.page_errors``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    p.set_default_timeout(30_000)
    p.dialogs, p.page_errors = [], []
    p.on("dialog", lambda d: (p.dialogs.append(d.message), d.dismiss()))
    p.on("pageerror", lambda e: p.page_errors.append(str(e)))
    try:
        yield p
    finally:
        context.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed browser test shows the tail of its ``agentrl view`` server's output."""
    outcome = yield
    report = outcome.get_result()
    server = getattr(item, "funcargs", {}).get("viewer")
    if report.failed and server is not None:
        report.sections.append(("agentrl view output", server[0].output()[-4000:]))
