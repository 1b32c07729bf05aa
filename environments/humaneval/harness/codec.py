"""Values across the grading boundary. Standard library only; its source is prepended to both
``supervisor.py`` and ``child.py`` (``environments.humaneval.scoring.harness_scripts``).

A value crosses between the test code (in the supervisor) and the candidate (in its own test
process) as JSON in a tagged form that only plain builtin values can take: ``None``,
``bool``, ``int``, ``float`` and ``str`` as JSON scalars; ``{"l": [...]}`` list,
``{"t": [...]}`` tuple, ``{"d": [[k, v], ...]}`` dict, ``{"s": [...]}`` set,
``{"f": [...]}`` frozenset, ``{"b": "<hex>"}`` bytes, ``{"c": [re, im]}`` complex.
``decode_value`` builds new objects of exactly those types, so nothing the candidate defines
(a class whose ``__eq__`` always says True, a subclass of ``int``) reaches the test's
comparisons. Integers beyond Python's 4,300-digit string limit do not cross.
"""

import json as _codec_json

_PLAIN_SCALARS = (type(None), bool, int, float, str)
_CONTAINER_TAGS = {list: "l", tuple: "t", set: "s", frozenset: "f"}
_TAG_TYPES = {"l": list, "t": tuple, "s": set, "f": frozenset}
_VALUE_BASES = (int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
_JUDGED_METHODS = frozenset((
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__",
    "__hash__", "__contains__", "__abs__", "__sub__", "__rsub__", "__float__", "__int__",
    "__index__", "__round__",
))
"""Methods through which an object decides how the test's comparisons see it."""


class ForeignValue(Exception):
    """A value that is not a plain builtin value. ``type_name`` names its type;
    ``judge_override`` is True when that type subclasses a builtin value type or defines its
    own comparison, truth, hash, arithmetic or conversion methods (a result built to
    answer the test's ``==`` in its own favour)."""

    def __init__(self, type_name, judge_override):
        super().__init__(type_name)
        self.type_name = type_name
        self.judge_override = judge_override


def _foreign(value):
    cls = type(value)
    try:
        name = str(cls.__qualname__)[:100]
    except BaseException:
        name = "an unnamed type"
    override = isinstance(value, _VALUE_BASES)
    if not override:
        try:
            override = any(
                getattr(base, "__module__", "") != "builtins" and _JUDGED_METHODS.intersection(vars(base))
                for base in cls.__mro__[:-1]
            )
        except BaseException:
            override = True
    return ForeignValue(name, bool(override))


def to_tagged(value):
    """``value`` in the tagged JSON form. Raises ``ForeignValue`` for anything that is not a
    plain builtin value (exact types only), ``RecursionError`` for a too deep or cyclic one."""
    cls = type(value)
    if cls in _PLAIN_SCALARS:
        return value
    tag = _CONTAINER_TAGS.get(cls)
    if tag is not None:
        return {tag: [to_tagged(x) for x in value]}
    if cls is dict:
        return {"d": [[to_tagged(k), to_tagged(v)] for k, v in value.items()]}
    if cls is bytes:
        return {"b": value.hex()}
    if cls is complex:
        return {"c": [value.real, value.imag]}
    raise _foreign(value)


def from_tagged(data):
    """The value ``data`` (the tagged form, already parsed from JSON) stands for, built from
    new builtin objects. Raises ``ValueError`` when ``data`` is not a well-formed tagged
    value (``TypeError`` for an unhashable set element or dict key)."""
    cls = type(data)
    if cls in _PLAIN_SCALARS:
        return data
    if cls is not dict or len(data) != 1:
        raise ValueError(f"not a tagged value: {cls.__name__}")
    (tag, body), = data.items()
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise ValueError(f"tag {tag!r} needs a list")
    if tag in _TAG_TYPES:
        return _TAG_TYPES[tag](from_tagged(x) for x in body)
    if tag == "d":
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("a dict item must be a [key, value] pair")
            out[from_tagged(pair[0])] = from_tagged(pair[1])
        return out
    if tag == "c" and len(body) == 2 and all(type(x) in (int, float) for x in body):
        return complex(body[0], body[1])
    raise ValueError(f"unknown tag {tag!r}")


def dumps_tagged(value):
    """``json.dumps(to_tagged(value))``; raises as ``to_tagged`` does, and ``ValueError``
    for an integer too long to write."""
    return _codec_json.dumps(to_tagged(value))


def loads_tagged(text):
    """Parse and rebuild a value written by ``dumps_tagged``; raises ``ValueError``,
    ``TypeError`` or ``RecursionError`` on anything else."""
    return from_tagged(_codec_json.loads(text))
