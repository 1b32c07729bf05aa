"""Dataclass fields that carry their documentation: ``documented`` declares one,
``field_doc`` reads it back. The trainers' config dataclasses declare every field so, and
the run configuration (``agentrl.config``) shows that text as the field's description."""

from __future__ import annotations

from dataclasses import MISSING, field, fields
from typing import Any


def documented(default: Any = MISSING, *, doc: str, default_factory: Any = MISSING) -> Any:
    """A dataclass field that carries its documentation (``metadata["doc"]``).

    This text is the one source of a field's documentation: ``field_doc`` reads it, and
    the run configuration (``agentrl.config``) uses it as the ``description`` of the
    field of the same name in its ``trainer`` / ``critic`` sections, so the two layers
    cannot drift apart."""
    return field(default=default, default_factory=default_factory, metadata={"doc": doc})


def field_doc(cls: type, name: str) -> str:
    """The documentation of dataclass field ``name`` of ``cls`` (see ``documented``).

    Raises:
        KeyError: ``cls`` has no field ``name`` or it carries no documentation.
    """
    for f in fields(cls):
        if f.name == name:
            if "doc" not in f.metadata:
                raise KeyError(f"{cls.__name__}.{name} carries no documentation (metadata['doc'])")
            return f.metadata["doc"]
    raise KeyError(f"{cls.__name__} has no field {name!r}")
