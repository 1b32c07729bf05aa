"""Where each turn of an episode sits in its trainer rows: ``TurnSpan`` (one turn's
row-local token offsets, ints) and ``EpisodeRows`` (one row: its spans, its length ``L``
and its key in a ``TokenBatch``). ``Episode.rows`` builds them; the trainer rows and the
credit room's value positions both read them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TurnSpan:
    """Where one turn sits in its trainer row (row-local token indices).

    Attributes:
        turn: index of the turn in ``Episode.turns``.
        prompt_start: first index of the turn's ``prompt_ids``.
        completion_start: first index of its ``completion_ids`` (= ``prompt_start +
            len(prompt_ids)``); the token before it is the turn's boundary, the last token
            of the state ``s_k``.
        completion_end: one past its last completion id (= ``completion_start +
            len(completion_ids)``).
    """

    turn: int
    prompt_start: int
    completion_start: int
    completion_end: int

    @property
    def prompt_len(self) -> int:
        return self.completion_start - self.prompt_start

    @property
    def completion_len(self) -> int:
        return self.completion_end - self.completion_start


@dataclass(frozen=True)
class EpisodeRows:
    """One trainer row of an episode (``Episode.rows``).

    Attributes:
        turns: the turns the row holds, in order, with their segment offsets.
        length: the row's token count ``L``.
        key: the row's id in a ``TokenBatch`` (the episode id; ``"{episode_id}:{k}"`` for
            turn k's row in ``per_step`` mode).
    """

    turns: tuple[TurnSpan, ...]
    length: int
    key: str

    @property
    def num_sampled(self) -> int:
        """Sampled tokens in this row (its ``sum(loss_mask)``)."""
        return sum(s.completion_len for s in self.turns)

    def loss_mask(self) -> list[int]:
        """``[L]`` 0/1: 1 exactly on the row's completion ids."""
        out: list[int] = []
        for s in self.turns:
            out.extend([0] * s.prompt_len + [1] * s.completion_len)
        return out

