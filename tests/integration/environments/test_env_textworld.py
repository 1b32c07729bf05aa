"""``agentrl/TextWorld-v0`` with the real ``textworld`` package: games generated into a
cache, won by TextWorld's own walkthrough, exact-state anchors, determinism."""

from __future__ import annotations

import pytest

textworld = pytest.importorskip("textworld")

import environments  # noqa: E402
from agentrl.errors import ConfigError, EnvError  # noqa: E402
from environments.textworld_env import TextWorldEnv, game_path, generate_games, parse_command, task_ids  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("twcache")


def test_walkthrough_wins_with_the_max_score_and_anchors_track_the_state(cache):
    env = environments.make_env("agentrl/TextWorld-v0", cache_dir=cache)
    obs, info = env.reset(seed=0, options={"task_id": "textworld/3"})
    assert obs.startswith("Objective:") and info["score"] == 0 and info["max_score"] >= 1
    walkthrough = textworld.Game.load(str(game_path(3, cache_dir=cache).with_suffix(".json"))).walkthrough
    total, anchors = 0.0, [info["anchor"]]
    for i, command in enumerate(walkthrough):
        obs, reward, term, trunc, info = env.step(f"<action>{command}</action>")
        total += reward
        anchors.append(info["anchor"])
        assert term == (i == len(walkthrough) - 1) and not trunc
    assert info["won"] and total == info["max_score"]
    assert len(set(anchors)) == len(anchors)  # every walkthrough step changes the world
    with pytest.raises(EnvError, match="after the episode"):
        env.step("look")
    env.close()


def test_same_task_same_start_and_look_keeps_the_anchor(cache):
    a = TextWorldEnv(cache_dir=cache)
    b = TextWorldEnv(cache_dir=cache)
    oa, ia = a.reset(seed=1, options={"task_id": "textworld/3"})
    ob, ib = b.reset(seed=2, options={"task_id": "textworld/3"})
    assert oa == ob and ia["anchor"] == ib["anchor"]
    _, r, term, trunc, info = a.step("look")
    assert (r, term, trunc) == (0.0, False, False) and info["anchor"] == ia["anchor"]
    obs, r, _, _, info = a.step("   ")
    assert info["invalid_action"] and r == 0.0 and "Invalid reply" in obs
    a.close(), b.close()
    a.close()  # idempotent
    c = TextWorldEnv(cache_dir=cache, show_admissible_commands=True)
    assert "Valid commands: " in c.reset(options={"task_id": "textworld/3"})[0]
    c.close()


def test_games_are_cached_and_reused(cache):
    (path,) = generate_games([3], cache_dir=cache)
    assert path == game_path(3, cache_dir=cache) and path.exists() and path.with_suffix(".json").exists()
    mtime = path.stat().st_mtime_ns
    generate_games([3], cache_dir=cache)
    assert path.stat().st_mtime_ns == mtime
    assert not [p for p in cache.iterdir() if p.name.startswith(".gen-")]


def test_step_limit_splits_and_bad_arguments(cache):
    env = TextWorldEnv(cache_dir=cache, max_steps=2)
    env.reset(options={"task_id": "textworld/3"})
    assert env.step("look")[2:4] == (False, False) and env.step("look")[2:4] == (False, True)
    assert len(task_ids("train")) == 1000 and not set(task_ids("train")) & set(task_ids("test"))
    with pytest.raises(ConfigError, match="quest_length=0"):
        TextWorldEnv(quest_length=0)
    with pytest.raises(ConfigError, match="'tw/1'"):
        env.reset(options={"task_id": "tw/1"})
    assert parse_command("I go <action> open   the door </action>") == "open the door"
    assert parse_command("x" * 201) is None


def test_games_generate_and_play_from_several_threads_at_once(tmp_path):
    """The rollout resets and steps environments from a thread pool; TextWorld's generator
    is not thread-safe on its own (found by the training test: 'pop from empty list')."""
    from concurrent.futures import ThreadPoolExecutor

    from environments.textworld_env import TextWorldEnv

    def play(seed):
        env = TextWorldEnv(cache_dir=tmp_path)
        obs, info = env.reset(seed=0, options={"task_id": f"textworld/{seed}"})
        out = env.step("look")
        env.close()
        return obs, out[0]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(play, [7001, 7002, 7003, 7004]))
    assert all(isinstance(o, str) and o and isinstance(s, str) for o, s in results)


# Replies that hung jericho's interpreter forever (printing gigabytes) before
# parse_command turned them away: dumb-frotz's backslash commands, DEL, CJK text.
HANGED_THE_INTERPRETER = ["\\q", "\\help", "\\x", "\\lt", "\\s", "<action>\\w</action>", "\x7f",
                          "\u4f60\u597d", "open \u4f60"]


def test_replies_the_interpreter_cannot_take_are_invalid_and_never_reach_it(cache):
    for reply in HANGED_THE_INTERPRETER:
        assert parse_command(reply) is None, reply
    assert parse_command("take the red key") == "take the red key"
    assert parse_command("look\\") is None and parse_command("go north\x00") is None
    # The real game, with a fuzz of printable ASCII and some Unicode: a reply that reached the
    # interpreter and hung it would raise EnvError after step_timeout_s.
    import string

    import numpy as np

    rng = np.random.default_rng(0)
    alphabet = list(string.printable + "\u00e9\u4f60\u2603\x00\x7f\\")
    replies = HANGED_THE_INTERPRETER + ["".join(rng.choice(alphabet, size=int(rng.integers(1, 40)))) for _ in range(150)]
    env = TextWorldEnv(cache_dir=cache, max_steps=10**6, step_timeout_s=5)
    env.reset(options={"task_id": "textworld/3"})
    sent = 0
    for reply in replies:
        obs, reward, term, trunc, info = env.step(reply)
        sent += not info["invalid_action"]
        assert not term, (reply, obs)
    assert sent > 0  # the printable-ASCII replies without a backslash did reach the game
    assert env.step("look")[0].startswith("-=")  # and it still answers
    env.close()


def test_a_hung_or_dead_interpreter_is_an_env_error_and_the_next_reset_plays_again(cache, monkeypatch):
    import environments.textworld_env as tw_env

    env = TextWorldEnv(cache_dir=cache, step_timeout_s=2)
    env.reset(options={"task_id": "textworld/3"})
    # Let a reply that loops the real interpreter through (parse_command normally refuses it).
    monkeypatch.setattr(tw_env, "parse_command", lambda text: text)
    with pytest.raises(EnvError, match=r"did not answer step \('\\\\q',\) within 2 s \(step_timeout_s"):
        env.step("\\q")
    assert not env._game.alive()
    with pytest.raises(EnvError, match="after the episode"):
        env.step("look")  # the episode is over
    monkeypatch.undo()
    obs, info = env.reset(options={"task_id": "textworld/3"})  # a new process
    assert obs.startswith("Objective:") and env.step("look")[0].startswith("-=")
    env._game.proc.kill()  # as when the interpreter calls exit() on a fatal error
    env._game.proc.wait()
    with pytest.raises(EnvError, match=r"process died \(exit code -9\) on step \('look',\)"):
        env.step("look")
    assert env.reset(options={"task_id": "textworld/3"})[0].startswith("Objective:")
    game = env._game
    env.close()
    assert not game.alive()
    for bad in (0, 1e7, float("nan"), True):
        with pytest.raises(ConfigError, match=rf"step_timeout_s={bad!r} must be a number of seconds in \(0, 86400\]"):
            TextWorldEnv(step_timeout_s=bad)


_PARENT = r"""
import sys
import environments.textworld_env as tw_env
env = tw_env.TextWorldEnv(cache_dir=sys.argv[1])
env.reset(options={"task_id": "textworld/3"})
env._game.conn.send(("step", "\\q"))  # loops the interpreter; nobody will read the answer
print(env._game.proc.pid, flush=True)
sys.stdin.read()
"""


def test_the_game_process_ends_when_the_env_process_is_killed_mid_step(cache):
    """A child looping inside the interpreter cannot read its socket; its watchdog ends it
    when the env's process is SIGKILLed (no orphan spinning at 100 % CPU)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(cache)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, cwd=Path(__file__).parents[3])
    try:
        child = int(parent.stdout.readline())
        time.sleep(1.0)
        assert _running(child)  # looping, not dead on its own
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 15
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(child)
    finally:
        parent.kill()
        parent.wait()


def _running(pid: int) -> bool:
    """Alive and not a zombie (a reparented child may wait for a reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
