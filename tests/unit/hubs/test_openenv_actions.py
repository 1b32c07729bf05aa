"""The OpenEnv adapter's reply parsing and schema reading (agentrl/hubs/openenv_actions.py):
pure functions over the JSON schemas an OpenEnv server publishes at /schema."""

from __future__ import annotations

import pytest

from agentrl.errors import ConfigError
from agentrl.hubs.openenv_actions import ActionSchema, SchemaError, observation_text, parse_action
from tests.helpers.openenv_fake import INT_ACTION, TEXT_ACTION

# What openenv 0.10.0's /schema says of an Action with one `guess: str` field (pydantic's schema).
PYDANTIC_TEXT = {"additionalProperties": False, "title": "GuessText", "type": "object", "required": ["guess"],
                 "properties": {"metadata": {"additionalProperties": True, "description": "Additional metadata",
                                             "title": "Metadata", "type": "object"},
                                "guess": {"description": "your guess", "title": "Guess", "type": "string"}}}


def test_schema_reading_finds_fields_required_and_the_one_text_field():
    text = ActionSchema.from_schema(PYDANTIC_TEXT)
    assert text.fields == ("guess",) and text.required == ("guess",) and text.text_field == "guess"
    moves = ActionSchema.from_schema(INT_ACTION)
    assert moves.fields == ("x", "y") and moves.required == ("x", "y") and moves.text_field is None
    nullable = ActionSchema.from_schema({"type": "object", "properties": {
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}}})
    assert nullable.text_field == "note"
    two_texts = ActionSchema.from_schema({"type": "object", "properties": {"a": {"type": "string"},
                                                                           "b": {"type": "string"}}})
    assert two_texts.text_field is None
    assert "metadata" not in ActionSchema.from_schema(TEXT_ACTION).describe()


@pytest.mark.parametrize("bad", [None, [], {"type": "object"}, {"type": "array", "properties": {}},
                                 {"type": "object", "properties": {"x": {"type": 5}}}])
def test_a_schema_that_is_no_action_schema_is_refused(bad):
    with pytest.raises(SchemaError):
        ActionSchema.from_schema(bad)


def test_json_whole_reply_and_fenced_json_are_read():
    schema = ActionSchema.from_schema(INT_ACTION)
    whole = parse_action('  {"x": 1, "y": -2}\n', schema)
    assert whole.valid and whole.action == {"x": 1, "y": -2} and whole.source == "json"
    fenced = parse_action('I move right.\n```json\n{"x": 3, "y": 4}\n```\nDone.', schema)
    assert fenced.action == {"x": 3, "y": 4} and fenced.source == "fenced"
    # the last fenced block that parses wins; a bare fence works too
    two = parse_action('```\n{"x": 1, "y": 1}\n```\nno, rather:\n```\n{"x": 2, "y": 2}\n```', schema)
    assert two.action == {"x": 2, "y": 2}
    broken_last = parse_action('```json\n{"x": 5, "y": 5}\n```\n```json\n{"x": 6,\n```', schema)
    assert broken_last.action == {"x": 5, "y": 5}


@pytest.mark.parametrize("reply, needle", [
    ("I go left", "no JSON object in the reply"),
    ('{"x": -1, "y": 0}', "x: -1 is less than the minimum of 0"),
    ('{"x": 1}', "'y' is a required property"),
    ('{"x": 1, "y": 2, "z": 3}', "Additional properties are not allowed"),
    ('[1, 2]', "not an object"),
    ('{"x": 1, "y": 2', "no JSON object"),
])
def test_a_reply_that_does_not_parse_or_validate_is_an_invalid_action_with_the_reason(reply, needle):
    parsed = parse_action(reply, ActionSchema.from_schema(INT_ACTION))
    assert not parsed.valid and parsed.action is None and parsed.source is None
    assert needle in parsed.error and "fields: x, y" in parsed.error


def test_one_text_field_takes_the_raw_reply_unless_it_is_a_valid_json_action():
    schema = ActionSchema.from_schema(PYDANTIC_TEXT)
    raw = parse_action("  my guess is 7\n", schema)
    assert raw.action == {"guess": "  my guess is 7\n"} and raw.source == "text"  # untouched, white space too
    assert parse_action('{"guess": "7"}', schema).action == {"guess": "7"}
    # JSON that is no valid action is text: the field's value is the reply itself
    assert parse_action('{"guess": 7}', schema).action == {"guess": '{"guess": 7}'}
    assert parse_action('{"guess": "7"}', schema, "text").action == {"guess": '{"guess": "7"}'}
    only_json = parse_action("my guess is 7", schema, "json")
    assert not only_json.valid and "no JSON object" in only_json.error


def test_bad_formats_are_config_errors():
    with pytest.raises(ConfigError, match="not one of"):
        parse_action("x", ActionSchema.from_schema(TEXT_ACTION), "yaml")
    with pytest.raises(ConfigError, match="one text field"):
        parse_action("x", ActionSchema.from_schema(INT_ACTION), "text")


def test_observation_text():
    assert observation_text({"prompt": "hello", "done": False, "reward": None, "metadata": {"a": 1}}) == "hello"
    assert observation_text({"board": [[0, 1]], "turn": "x", "done": False}) == '{"board": [[0, 1]], "turn": "x"}'
    assert observation_text({"board": [[0, 1]], "turn": "x"}, "turn") == "x"
    assert observation_text({"board": [[0, 1]], "turn": "x"}, "board") == "[[0, 1]]"
    with pytest.raises(KeyError):
        observation_text({"turn": "x"}, "board")
