"""The base of every run-config section: a pydantic model that refuses unknown keys and
validates on assignment."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A run-config section: unknown keys are an error (``extra="forbid"``) and an
    assignment is validated as a loaded value is."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
