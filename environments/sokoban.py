"""``agentrl/Sokoban-v0``: push every box onto a target; boards generated procedurally,
solvable by construction; the board is text, the action a word. Pure Python, no sandbox.

Boards (``generate_board``)
    As in Schrader's gym-sokoban generator (M.-P. B. Schrader, "gym-sokoban", 2018,
    following Weber et al. 2017, "Imagination-Augmented Agents", arXiv:1707.06203, App. C):
    1. a room topology is carved by a random walk inside a wall border;
    2. ``num_boxes`` targets and the player are placed on random floor cells, every box
       starts on a target (a solved state);
    3. the game is played *in reverse* for ``num_gen_steps`` random moves: the player
       moves one cell, and may pull a box that sits right behind it. Every reverse move is
       the inverse of a legal forward move (a pull backwards is a push forwards), so the
       reached state can be solved by replaying the moves forwards;
    4. of the states visited, the one with the highest score ``box swaps x total box
       displacement`` (a box swap: the pulled box differs from the previous one) is the
       start, if at least one box is off its target; otherwise the board is regenerated.
    Everything is drawn from ``numpy.random.default_rng(seed)``: the same seed and
    parameters give the same board on every machine.

Tasks and split
    A task is a generator seed: ``sokoban/<seed>``. ``train`` is seeds 0..9999, ``test``
    seeds 1,000,000..1,000,499 (``TRAIN_SEEDS``, ``TEST_SEEDS``); ``all`` both. The board
    of a task also depends on the env's ``dim_room`` and ``num_boxes``.

Observation
    The board in XSB notation with ``_`` for floor: ``#`` wall, ``_`` floor, ``.`` target,
    ``$`` box, ``*`` box on target, ``@`` player, ``+`` player on target; one row per line,
    followed by a line of feedback on the last move.

Actions
    ``up``, ``down``, ``left`` or ``right``: the content of the last
    ``<action>...</action>`` tag if the reply has one, else the whole reply (case and
    surrounding whitespace/punctuation ignored). Anything else is an invalid action: no
    move, the step penalty, ``info["invalid_action"] = True``, and the observation says
    what is expected. Moving into a wall, or pushing a box into a wall or another box,
    is a valid action that does not move.

Reward (gym-sokoban's shaping)
    -0.1 every step (``STEP_PENALTY``); +1 for a box pushed onto a target
    (``BOX_ON_TARGET``); -1 for a box pushed off a target (``BOX_OFF_TARGET``); +10 when
    every box is on a target (``SOLVED_BONUS``), which terminates the episode.
    ``max_steps`` steps without solving truncate it.

Anchor
    ``(task_id, player (row, col), boxes (sorted tuple of (row, col)))``: the exact game
    state, so GiGPO (Feng et al. 2025, arXiv:2505.10978) groups steps from identical states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

from agentrl.errors import ConfigError
from agentrl.types import StepInfo
from environments.core import TextEnv
from environments.seeded import SPLITS, SeededTasks, last_tag_content

__all__ = [
    "ENV_ID", "SPLITS", "TRAIN_SEEDS", "TEST_SEEDS", "ACTIONS", "STEP_PENALTY", "BOX_ON_TARGET",
    "BOX_OFF_TARGET", "SOLVED_BONUS", "Board", "generate_board", "render", "parse_action",
    "task_ids", "SokobanEnv",
]

ENV_ID = "agentrl/Sokoban-v0"
TRAIN_SEEDS = range(0, 10_000)
TEST_SEEDS = range(1_000_000, 1_000_500)
STEP_PENALTY = -0.1
BOX_ON_TARGET = 1.0
BOX_OFF_TARGET = -1.0
SOLVED_BONUS = 10.0
ACTIONS: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

Pos = tuple[int, int]


@dataclass(frozen=True)
class Board:
    """A Sokoban position.

    Attributes:
        walls: ``(rows, cols)`` bool array, True for walls (read-only).
        targets: target cells.
        boxes: box cells (sorted).
        player: the player's cell.
    """

    walls: np.ndarray
    targets: frozenset[Pos]
    boxes: tuple[Pos, ...]
    player: Pos

    @property
    def solved(self) -> bool:
        return set(self.boxes) == set(self.targets)


TASKS = SeededTasks("sokoban", "Sokoban", TRAIN_SEEDS, TEST_SEEDS)
"""The task ids of this env and their seeds (``environments.seeded``)."""


def task_ids(split: str = "train") -> list[str]:
    """``sokoban/<seed>`` for the seeds of ``split``. Raises ConfigError for an unknown split."""
    return TASKS.task_ids(split)


_seed_of = TASKS.seed_of


def _carve_room(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Floor mask (True = floor) carved by a random walk inside a one-cell wall border."""
    floor = np.zeros((rows, cols), dtype=bool)
    r, c = int(rng.integers(1, rows - 1)), int(rng.integers(1, cols - 1))
    dirs = list(ACTIONS.values())
    d = dirs[int(rng.integers(4))]
    for _ in range(int(1.5 * (rows + cols))):
        floor[r, c] = True
        if rng.random() < 0.5:  # widen: a random neighbour too (rooms, not only corridors)
            dr, dc = dirs[int(rng.integers(4))]
            if 1 <= r + dr < rows - 1 and 1 <= c + dc < cols - 1:
                floor[r + dr, c + dc] = True
        if rng.random() < 0.35:
            d = dirs[int(rng.integers(4))]
        nr, nc = r + d[0], c + d[1]
        if 1 <= nr < rows - 1 and 1 <= nc < cols - 1:
            r, c = nr, nc
        else:
            d = dirs[int(rng.integers(4))]
    return floor


def generate_board(seed: int, dim_room: tuple[int, int] = (7, 7), num_boxes: int = 2,
                   num_gen_steps: int | None = None, max_tries: int = 100) -> Board:
    """The start position of seed ``seed`` (see the module docstring for the method).

    Args:
        seed: generator seed (``numpy.random.default_rng``).
        dim_room: ``(rows, cols)``, walls included; each >= 5.
        num_boxes: boxes (and targets), >= 1.
        num_gen_steps: reverse moves; default ``int(1.7 * (rows + cols))`` per box.
        max_tries: rooms tried before giving up.

    Raises:
        ConfigError: invalid parameters, or no room of ``max_tries`` fits the boxes.
    """
    rows, cols = dim_room
    if rows < 5 or cols < 5:
        raise ConfigError(f"dim_room={dim_room!r}: rows and cols must each be >= 5")
    if not isinstance(num_boxes, int) or num_boxes < 1:
        raise ConfigError(f"num_boxes={num_boxes!r} must be an int >= 1")
    steps = num_gen_steps if num_gen_steps is not None else int(1.7 * (rows + cols)) * num_boxes
    rng = np.random.default_rng(seed)
    dirs = list(ACTIONS.values())
    for _ in range(max_tries):
        floor = _carve_room(rng, rows, cols)
        cells = [tuple(int(v) for v in x) for x in np.argwhere(floor)]
        if len(cells) < num_boxes + 3:
            continue
        picks = rng.choice(len(cells), size=num_boxes + 1, replace=False)
        targets = [cells[int(i)] for i in picks[:num_boxes]]
        player = cells[int(picks[-1])]
        boxes = list(targets)  # box i started on targets[i]
        best: tuple[float, tuple[Pos, ...], Pos] | None = None
        last_pulled, swaps = -1, 0
        for _ in range(steps):
            dr, dc = dirs[int(rng.integers(4))]
            nxt = (player[0] + dr, player[1] + dc)
            if not floor[nxt] or nxt in boxes:
                continue
            behind = (player[0] - dr, player[1] - dc)
            pull = rng.random() < 0.5 and behind in boxes
            if pull:
                i = boxes.index(behind)
                boxes[i] = player
                if i != last_pulled:
                    swaps += 1
                    last_pulled = i
            player = nxt
            displacement = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
            score = swaps * displacement
            if score > 0 and set(boxes) != set(targets) and (best is None or score > best[0]):
                best = (score, tuple(boxes), player)
        if best is None:
            continue
        walls = ~floor
        walls.setflags(write=False)
        return Board(walls=walls, targets=frozenset(targets), boxes=tuple(sorted(best[1])), player=best[2])
    raise ConfigError(f"no solvable board with num_boxes={num_boxes} in dim_room={dim_room} after {max_tries} "
                      "rooms; use fewer boxes or a larger room")


def render(board: Board) -> str:
    """The board in XSB notation with ``_`` for floor (see the module docstring)."""
    rows, cols = board.walls.shape
    boxes = set(board.boxes)
    out = []
    for r in range(rows):
        line = []
        for c in range(cols):
            p = (r, c)
            t = p in board.targets
            if board.walls[r, c]:
                line.append("#")
            elif p == board.player:
                line.append("+" if t else "@")
            elif p in boxes:
                line.append("*" if t else "$")
            else:
                line.append("." if t else "_")
        out.append("".join(line))
    return "\n".join(out)


def parse_action(text: str) -> str | None:
    """``"up"``/``"down"``/``"left"``/``"right"`` from a reply, or None (see module docstring)."""
    tagged = last_tag_content(text, "action")
    word = tagged if tagged is not None else text
    word = word.strip().strip(".!,;:'\"`*").strip().lower()
    return word if word in ACTIONS else None


class SokobanEnv(TextEnv):
    """Sokoban with text observations and actions; see the module docstring.

    Args:
        sandbox: ignored (accepted so ``make_env(..., sandbox=...)`` works for every env).
        split: the tasks ``reset`` draws from when ``options`` names none.
        dim_room: ``(rows, cols)`` of the board, walls included. Default ``(7, 7)``.
        num_boxes: boxes per board. Default 2.
        max_steps: steps before the episode is truncated. Default 50.
        num_gen_steps: reverse moves of the generator (default: see ``generate_board``).

    Raises:
        ConfigError: an argument is out of range.
    """

    uses_sandbox = False  # runs in-process: the rollout makes it without a sandbox
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, sandbox: Any = None, split: str = "train", dim_room: tuple[int, int] | list[int] = (7, 7),
                 num_boxes: int = 2, max_steps: int = 50, num_gen_steps: int | None = None,
                 render_mode: str | None = None) -> None:
        super().__init__()
        self._split_seeds = TASKS.seeds(split)  # validates the split
        dim = tuple(dim_room)
        if len(dim) != 2 or not all(isinstance(x, int) and x >= 5 for x in dim):
            raise ConfigError(f"dim_room={dim_room!r} must be two ints >= 5")
        if not isinstance(num_boxes, int) or num_boxes < 1:
            raise ConfigError(f"num_boxes={num_boxes!r} must be an int >= 1")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ConfigError(f"max_steps={max_steps!r} must be an int >= 1")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode={render_mode!r}; expected None or 'ansi'")
        self.split = split
        self.dim_room = (int(dim[0]), int(dim[1]))
        self.num_boxes = num_boxes
        self.max_steps = max_steps
        self.num_gen_steps = num_gen_steps
        self.render_mode = render_mode
        self._board: Board | None = None
        self._steps = 0

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        return task_ids(split)

    @classmethod
    def checker_actions(cls) -> list[str]:
        """For ``check_env``: valid, invalid and tagged moves; the step limit ends it."""
        return ["up", "<action>left</action>", "jump!", "Right.", "down"] * 10 + ["up"]

    @property
    def board(self) -> Board | None:
        return self._board

    @property
    def system_prompt(self) -> str:
        return (
            "You play Sokoban. Push every box onto a target. The board uses these symbols: "
            "# wall, _ floor, . target, $ box, * box on a target, @ you, + you on a target. "
            "You move one cell up, down, left or right; walking into a box pushes it one cell "
            "if the cell behind it is free. Boxes cannot be pulled, so do not push a box into a "
            f"corner. You have {self.max_steps} moves. Reply with exactly one move per turn, as "
            "<action>up</action> (or down, left, right)."
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start the board of ``options["task_id"]`` (else a seed drawn from the split).

        Raises:
            EnvError: after ``close``. ConfigError: unknown option or task id.
        """
        task_id = TASKS.task_for_reset(self._start_reset(seed, options), self.np_random, self._split_seeds)
        board = generate_board(_seed_of(task_id), self.dim_room, self.num_boxes, self.num_gen_steps)
        self._task_id, self._board, self._steps, self._done = task_id, board, 0, False
        info = self._info(invalid=False, system_prompt=self.system_prompt, tools=())
        info["split"] = TASKS.split_of(task_id)
        return f"{render(board)}\nPush all {len(board.targets)} boxes onto the targets. Your move?", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One move; reward as in the module docstring.

        Raises:
            EnvError: no episode running, or ``action`` is not a str.
        """
        self._check_step(action)
        self._steps += 1
        reward = STEP_PENALTY
        move = parse_action(action)
        board = self._board
        if move is None:
            feedback = ("Invalid move: reply with exactly one of up, down, left, right, "
                        "e.g. <action>up</action>. You did not move.")
        else:
            dr, dc = ACTIONS[move]
            nxt = (board.player[0] + dr, board.player[1] + dc)
            boxes = set(board.boxes)
            if board.walls[nxt]:
                feedback = f"You moved {move} into a wall and did not move."
            elif nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if board.walls[beyond] or beyond in boxes:
                    feedback = f"You pushed {move} but the box is blocked; nothing moved."
                else:
                    boxes.remove(nxt)
                    boxes.add(beyond)
                    was, now = nxt in board.targets, beyond in board.targets
                    reward += BOX_ON_TARGET * (now and not was) + BOX_OFF_TARGET * (was and not now)
                    where = " onto a target" if now and not was else " off a target" if was and not now else ""
                    feedback = f"You moved {move} and pushed a box{where}."
                    board = Board(board.walls, board.targets, tuple(sorted(boxes)), nxt)
            else:
                feedback = f"You moved {move}."
                board = Board(board.walls, board.targets, board.boxes, nxt)
        self._board = board
        terminated = board.solved
        if terminated:
            reward += SOLVED_BONUS
            feedback += " All boxes are on targets: solved!"
        truncated = not terminated and self._steps >= self.max_steps
        if truncated:
            feedback += f" Out of moves ({self.max_steps}); the game is over."
        self._done = terminated or truncated
        info = self._info(invalid=move is None)
        return f"{render(board)}\n{feedback}", float(round(reward, 10)), terminated, truncated, info

    def render(self) -> str | None:
        return render(self._board) if self._board is not None and self.render_mode == "ansi" else None

    def close(self) -> None:
        """Nothing to release; idempotent."""
        super().close()

    def _info(self, *, invalid: bool, **step_info: Any) -> dict[str, Any]:
        b = self._board
        assert b is not None and self._task_id is not None
        anchor: Hashable = (self._task_id, b.player, b.boxes)
        return StepInfo(anchor=anchor, invalid_action=invalid, success=all(x in b.targets for x in b.boxes),
                        **step_info).to_info(task_id=self._task_id, boxes_on_target=sum(x in b.targets for x in b.boxes),
                                             steps=self._steps)
