"""``agentrl/Sokoban-v0``: generated boards are solvable (an independent BFS solver here),
reward shaping values, action parsing, determinism, splits."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

import environments
from agentrl.errors import ConfigError, EnvError
from environments.checker import check_env, format_report
from environments.sokoban import (
    ACTIONS, TEST_SEEDS, Board, SokobanEnv, generate_board, parse_action, render, task_ids,
)


def solve(board: Board, max_states: int = 200_000) -> list[str] | None:
    """Shortest move sequence solving ``board`` (BFS over (player, boxes)), or None."""
    start = (board.player, frozenset(board.boxes))
    prev: dict = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        player, boxes = state
        if boxes == board.targets:
            path = []
            while prev[state] is not None:
                state, move = prev[state]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in ACTIONS.items():
            nxt = (player[0] + dr, player[1] + dc)
            if board.walls[nxt]:
                continue
            new_boxes = boxes
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if board.walls[beyond] or beyond in boxes:
                    continue
                new_boxes = (boxes - {nxt}) | {beyond}
            new = (nxt, new_boxes)
            if new not in prev:
                prev[new] = (state, move)
                queue.append(new)
        assert len(prev) < max_states, "search space too large for the test"
    return None


@pytest.mark.parametrize("dim_room,num_boxes", [((7, 7), 1), ((7, 7), 2), ((8, 9), 3)])
def test_generated_boards_are_solvable_and_not_already_solved(dim_room, num_boxes):
    for seed in range(40):
        board = generate_board(seed, dim_room, num_boxes)
        assert board.walls.shape == dim_room and len(board.boxes) == len(board.targets) == num_boxes
        assert board.walls[0].all() and board.walls[-1].all() and board.walls[:, 0].all() and board.walls[:, -1].all()
        assert not board.solved
        path = solve(board)
        assert path, f"seed {seed} unsolvable:\n{render(board)}"


def test_playing_the_bfs_solution_in_the_env_solves_it_with_the_literature_shaping():
    env = SokobanEnv()
    for seed in range(10):
        env.reset(options={"task_id": f"sokoban/{seed}"})
        board = env.board
        path = solve(board)
        total, on_target_before = 0.0, sum(b in board.targets for b in board.boxes)
        for i, move in enumerate(path):
            obs, reward, term, trunc, info = env.step(f"<action>{move}</action>")
            total += reward
            assert term == (i == len(path) - 1) and not trunc and not info["invalid_action"]
        n = len(board.targets)
        # every step -0.1; net boxes brought onto targets +1 each; +10 solved
        assert total == pytest.approx(-0.1 * len(path) + (n - on_target_before) + 10.0)
        assert "solved" in obs
        with pytest.raises(EnvError, match="after the episode"):
            env.step("up")


def test_push_onto_and_off_a_target_and_blocked_moves():
    walls = np.ones((5, 7), dtype=bool)
    walls[2, 1:6] = False  # one corridor: (2,1)..(2,5)
    board = Board(walls=walls, targets=frozenset({(2, 3), (2, 5)}), boxes=((2, 2),), player=(2, 1))
    # two targets, one box: unsolvable but fine for the shaping values
    env = SokobanEnv()
    env.reset(options={"task_id": "sokoban/0"})
    env._board = board  # the test's own position
    assert env.step("right")[1] == pytest.approx(-0.1 + 1.0)   # box onto (2,3)
    assert env.step("right")[1] == pytest.approx(-0.1 - 1.0)   # box off (2,3) to (2,4)
    obs, r, *_ = env.step("up")                                 # wall
    assert r == pytest.approx(-0.1) and "wall" in obs
    env.step("right")                                           # box onto (2,5): +1
    obs, r, *_ = env.step("right")                              # box against the wall
    assert r == pytest.approx(-0.1) and "blocked" in obs
    obs, r, term, trunc, info = env.step("dance")
    assert r == pytest.approx(-0.1) and info["invalid_action"] and "Invalid move" in obs


def test_step_limit_truncates():
    env = SokobanEnv(max_steps=3)
    env.reset(options={"task_id": "sokoban/1"})
    flags = [env.step("nothing")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]


@pytest.mark.parametrize("text,move", [
    ("up", "up"), ("  Left. ", "left"), ("<action>down</action>", "down"),
    ("I think <action>up</action> then <ACTION> Right </ACTION>", "right"), ("go up", None),
    ("<action>jump</action>", None), ("", None),
])
def test_parse_action(text, move):
    assert parse_action(text) == move


def test_determinism_and_anchor():
    a, b = SokobanEnv(), SokobanEnv()
    oa, ia = a.reset(seed=5, options={"task_id": "sokoban/77"})
    ob, ib = b.reset(seed=9, options={"task_id": "sokoban/77"})
    assert oa == ob and ia["anchor"] == ib["anchor"]
    hash(ia["anchor"])
    assert ia["anchor"] == ("sokoban/77", a.board.player, a.board.boxes)
    # without a task id the seed picks it, reproducibly
    assert a.reset(seed=3)[0] == b.reset(seed=3)[0]
    assert generate_board(12).boxes == generate_board(12).boxes


def test_splits_and_bad_arguments():
    assert len(task_ids("train")) == 10_000 and len(task_ids("test")) == len(TEST_SEEDS)
    assert not set(task_ids("train")) & set(task_ids("test"))
    for kwargs, pattern in [({"dim_room": (4, 7)}, "dim_room"), ({"num_boxes": 0}, "num_boxes=0"),
                            ({"max_steps": 0}, "max_steps=0"), ({"split": "x"}, "split='x'")]:
        with pytest.raises(ConfigError, match=pattern):
            SokobanEnv(**kwargs)
    with pytest.raises(ConfigError, match="'soko/1'"):
        SokobanEnv().reset(options={"task_id": "soko/1"})
    with pytest.raises(ConfigError, match="num_boxes=30"):
        generate_board(0, (5, 5), 30, max_tries=5)


def test_made_through_the_registry_without_a_sandbox_and_passes_the_checker():
    env = environments.make_env("agentrl/Sokoban-v0", dim_room=(6, 6), num_boxes=1)
    assert env.reset(options={"task_id": "sokoban/3"})[0].count("\n") >= 6
    report = check_env("agentrl/Sokoban-v0")
    assert report.ok, format_report(report)


def test_task_ids_are_canonical_and_split_all_draws_both():
    from environments.sokoban import SokobanEnv, parse_action

    for bad in ("sokoban/03", "sokoban/\u0663"):
        with pytest.raises(ConfigError, match="decimal seed"):
            SokobanEnv(dim_room=(6, 6), num_boxes=1).reset(options={"task_id": bad})
    env = SokobanEnv(split="all", dim_room=(6, 6), num_boxes=1)
    assert {env.reset(seed=i)[1]["split"] for i in range(300)} == {"train", "test"}
    assert parse_action("<action>" * 50_000 + "left</action>") == "left"
    assert parse_action("<ACTION>up</Action> then <action>down</action>") == "down"
