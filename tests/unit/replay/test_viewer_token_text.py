"""The token view's text (``agentrl.model_zoo.token_text``) and the viewer's warm-up: the
first episode page after ``agentrl view`` starts does not wait for a tokenizer.

The token decoder the CLI hands the viewer reads ``tokenizer.json`` with the ``tokenizers``
library and never imports transformers (whose import is most of the 5-9 s a first token
view used to take); its strings equal transformers' ``decode([id])``. The viewer loads the
newest runs' tokenizers when it starts, before it takes requests.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import markupsafe
import pytest
from fastapi.testclient import TestClient

from agentrl.replay import ReplayStore
from agentrl.replay.read import ReadOnlyDB, model_paths
from agentrl.replay.viewer import create_app
from agentrl.types import Episode, SamplingRecord, TerminationReason, Turn

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tokenizer_ids(tiny_model_path: str) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tiny_model_path) / "tokenizer.json"))
    return tok.encode("<|im_start|>user\nls -la ~/notes → café 123<|im_end|>").ids + [0, 1, 2, 49151]


def test_cli_token_text_matches_transformers_without_importing_it(tiny_model_path: str,
                                                                  tokenizer_ids: list[int]) -> None:
    from transformers import AutoTokenizer

    code = ("import json, sys\n"
            "from agentrl.cli.viewing import token_text as _token_text\n"
            f"texts = _token_text()({tiny_model_path!r}, {tokenizer_ids!r})\n"
            "print(json.dumps({'texts': texts, 'transformers': 'transformers' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    tok = AutoTokenizer.from_pretrained(tiny_model_path, local_files_only=True)
    assert got["texts"] == [tok.decode([i]) for i in tokenizer_ids]
    assert got["texts"][:3] == ["<|im_start|>", "user", "\n"]
    assert got["transformers"] is False


def test_token_text_of_a_model_that_cannot_be_loaded_is_none(tmp_path: Path, caplog) -> None:
    from agentrl.model_zoo.token_text import TokenTexts

    texts = TokenTexts()
    assert texts(str(tmp_path / "gone"), [1, 2]) is None
    assert texts(str(tmp_path / "gone"), [3]) is None  # remembered: one warning, no second load
    assert sum("token view shows ids" in r.getMessage() for r in caplog.records) == 1


def _episode(eid: str, ids: list[int]) -> Episode:
    turn = Turn(prompt_ids=ids[:4], completion_ids=ids[4:], behavior_log_probs=[-0.5] * (len(ids) - 4),
                sampling=SamplingRecord(temperature=1.0, top_p=1.0, top_k=-1), policy_version=0,
                finish_reason="stop", reward=1.0, anchor="s0", action_text="ls", observation_text="ok")
    return Episode(group_id="g0", env_id="agentrl/Test-v0", task_id="t0", seed=0, turns=[turn], terminated=True,
                   truncated=False, termination_reason=TerminationReason.ENV_TERMINATED, episode_id=eid)


def test_viewer_loads_the_runs_tokenizer_before_its_first_request(tmp_path: Path, tiny_model_path: str,
                                                                   tokenizer_ids: list[int]) -> None:
    from agentrl.model_zoo.token_text import TokenTexts

    url = f"sqlite:///{tmp_path / 'replay.db'}"
    store = ReplayStore(url)
    try:
        store.start_run("old", {"env": {"id": "agentrl/Test-v0"}, "model": {"path": str(tmp_path / "gone")}})
        store.start_run("eval", {"kind": "eval", "config": {"env": {"id": "agentrl/Test-v0"},
                                                            "model": {"path": tiny_model_path}}})
        store.add_episodes("eval", 0, [_episode("ep-0", tokenizer_ids)])
    finally:
        store.close()
    db = ReadOnlyDB(url)
    calls: list[tuple[str, list[int]]] = []
    texts = TokenTexts()

    def token_text(model_path: str, ids: list[int]) -> list[str] | None:
        calls.append((model_path, list(ids)))
        return texts(model_path, ids)

    try:
        assert model_paths(db) == [tiny_model_path, str(tmp_path / "gone")]  # newest run first, eval unwrapped
        with TestClient(create_app(db, token_text, allowed_hosts=["testserver"])) as client:
            assert (tiny_model_path, []) in calls  # loaded at start-up, before any request
            assert texts.decoder(tiny_model_path) is not None
            n = len(calls)
            page = client.get("/episode?id=ep-0")
            assert page.status_code == 200
            assert calls[n:] == [(tiny_model_path, tokenizer_ids)]
            shown = re.findall(r'data-testid="token" [^>]*>([^<]*)</span>', page.text)
            assert shown == [str(markupsafe.escape(t)) for t in texts(tiny_model_path, tokenizer_ids)]
            assert shown[:2] == ["&lt;|im_start|&gt;", "user"]
    finally:
        db.close()


def _transformers_decode(folder: Path, ids: list[int]) -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return [tok.decode([i]) for i in ids]


def test_token_text_cleans_up_spaces_when_the_tokenizer_config_asks_as_transformers_does(tmp_path: Path,
                                                                                         tiny_model_path: str) -> None:
    """A word-level tokenizer whose config sets ``clean_up_tokenization_spaces``: transformers'
    ``decode([id])`` removes the space before punctuation and contractions; so does the token
    view. Without the setting, the text stays as the tokenizer decodes it."""
    import shutil

    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    from agentrl.model_zoo.token_text import TokenTexts

    vocab = {"[UNK]": 0, "it 's": 1, "wait .": 2, "do n't": 3, "a , b": 4, "why ?": 5, "plain": 6, "we 're ' here": 7}
    ids = list(vocab.values())
    for clean, folder in ((True, tmp_path / "clean"), (False, tmp_path / "kept")):
        folder.mkdir()
        shutil.copy(Path(tiny_model_path) / "config.json", folder / "config.json")  # a model folder
        Tokenizer(WordLevel(vocab, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": clean}))
        got = TokenTexts()(str(folder), ids)
        assert got == _transformers_decode(folder, ids)
        if clean:
            assert got[1:6] == ["it's", "wait.", "don't", "a, b", "why?"] and got[7] == "we're'here"
        else:
            assert got[1:3] == ["it 's", "wait ."]


def test_a_bpe_tokenizer_is_not_cleaned_up_unless_forced_as_in_transformers(tmp_path: Path, tiny_model_path: str) -> None:
    """SmolLM2's BPE tokenizer with ``clean_up_tokenization_spaces`` asked for: transformers
    skips the clean-up for BPE (it would eat real spaces) unless forced; the token view too."""
    import shutil

    from tokenizers import Tokenizer

    from agentrl.model_zoo.token_text import TokenTexts

    tok = Tokenizer.from_file(str(Path(tiny_model_path) / "tokenizer.json"))
    ids = tok.encode("a . b , it 's ?").ids
    config = json.loads((Path(tiny_model_path) / "tokenizer_config.json").read_text())
    for forced in (False, True):
        folder = tmp_path / f"forced-{forced}"
        folder.mkdir()
        for name in ("config.json", "tokenizer.json"):
            shutil.copy(Path(tiny_model_path) / name, folder / name)
        (folder / "tokenizer_config.json").write_text(json.dumps(dict(
            config, clean_up_tokenization_spaces=True,
            clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=forced)))
        got = TokenTexts()(str(folder), ids)
        assert got == _transformers_decode(folder, ids)
        assert (" ." in got) is not forced
