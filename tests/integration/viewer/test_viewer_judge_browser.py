"""The judge in Chromium (``agentrl view`` over the SQLite store of
tests/unit/replay/test_viewer_judge.py): a judged episode's Judge section, its prompt opened
with each message's role, the per-criterion table, and the judge's `<script>` output shown as
text that runs nothing."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest

from tests.integration.viewer.conftest import ViewerServer, serve_filled
from tests.unit.replay.test_viewer_judge import JUDGED, PROMPT, SCORES, XSS, fill


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ViewerServer]:
    yield from serve_filled(fill, tmp_path_factory, "judge-view")


def test_the_browser_opens_the_judges_prompt_and_scores(page, server: ViewerServer) -> None:
    page.goto(f"{server.base}/episode?id={quote(JUDGED, safe='')}")
    judge = page.get_by_test_id("judge")
    assert judge.is_visible() and page.get_by_test_id("judge-decided").inner_text() == "the judge (1 call)"
    messages = page.get_by_test_id("judge-message")
    assert not messages.first.is_visible()  # inside a closed <details>
    page.get_by_test_id("judge-prompt").locator("summary").click()
    assert messages.first.is_visible()
    assert messages.evaluate_all("ms => ms.map(m => m.dataset.role)") == [m["role"] for m in PROMPT]
    assert messages.locator("pre").all_inner_texts()[1] == "Task: 96%? Answer: " + XSS  # text, not markup
    rows = page.get_by_test_id("judge-criterion")
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.name)") == list(SCORES)
    assert rows.locator("td:nth-child(2)").all_inner_texts() == [f"{v:g}" for v in SCORES.values()]
    page.get_by_test_id("judge-output").locator("summary").click()
    assert page.get_by_test_id("judge-output-text").inner_text() == '{"scores": ' + XSS + "}"
    assert page.evaluate("window.__pwned") is None
    assert page.page_errors == [] and page.dialogs == []
