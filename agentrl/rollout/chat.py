"""Delta tokenization through the chat template (docs/design.md, invariant 1).

A multi-turn episode's token stream is built turn by turn: the engine's sampled ids are
kept exactly, and only the *new* messages (observations, tool results) are rendered with
the chat template and tokenized. Re-encoding the decoded completion is never done: BPE is
not one-to-one, so ``encode(decode(ids)) != ids`` in general (docs/cases.md, C01).

How the delta is found: render a base conversation that ends with an assistant message,
render it again with the new messages appended (and the generation prompt), and take the
string difference. The sampled completion ends with the stop token; whatever the template
writes *after* the assistant's stop token (e.g. ChatML's ``"\\n"``) is glue that belongs to
the delta. ``ChatTokenizer.check_incremental`` proves at start-up that this reproduces the
full rendering for a probe conversation (assistant with two tool calls → tool result A →
tool result B → assistant; docs/cases.md, C02) and raises ``TemplateError`` if the template cannot
be extended turn by turn (for example, templates that rewrite earlier turns).
"""

from __future__ import annotations

from dataclasses import dataclass
import json
from typing import Any, Mapping, Sequence

from agentrl.errors import TemplateError
from agentrl.types import tool_function

Message = dict[str, Any]

_PROBE_USER = "Probe question: what is 2 + 3?"
_PROBE_ASSISTANT = "Probe answer."


@dataclass
class ChatTokenizer:
    """Renders and tokenizes conversations turn by turn for one HF tokenizer.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        stop_token_ids: ids the engine stops on (all EOS ids of the generation config);
            the first one is the id the template writes after an assistant message.

    Raises:
        TemplateError: the tokenizer has no chat template, or (from ``check_incremental``)
            the template cannot be extended turn by turn.
    """

    tokenizer: Any
    stop_token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not getattr(self.tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template; agentrl needs one to build multi-turn prompts")
        if not self.stop_token_ids:
            raise TemplateError("no stop token ids: the model's generation config declares no EOS")
        self._tools_rendered = self._template_renders_tools()
        self._end_text, self._glue = self._assistant_end()

    # --- rendering -------------------------------------------------------------------
    def _render(self, messages: Sequence[Message], *, add_generation_prompt: bool, tools: Sequence[dict] | None = None) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools and self._tools_rendered:
            kwargs["tools"] = list(tools)
        return self.tokenizer.apply_chat_template(list(messages), **kwargs)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _template_renders_tools(self) -> bool:
        msgs = [{"role": "user", "content": _PROBE_USER}]
        tool = {"type": "function", "function": {"name": "probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}}}
        try:
            with_tools = self.tokenizer.apply_chat_template(msgs, tools=[tool], tokenize=False, add_generation_prompt=True)
        except Exception:
            return False
        without = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return with_tools != without and "probe_tool" in with_tools

    def _assistant_end(self) -> tuple[str, str]:
        """Find the stop token's text after an assistant message and the glue after it."""
        base = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
        text = self._render(base, add_generation_prompt=False)
        idx = text.rfind(_PROBE_ASSISTANT)
        if idx < 0:
            raise TemplateError("the chat template does not reproduce assistant content verbatim")
        after = text[idx + len(_PROBE_ASSISTANT):]
        for sid in self.stop_token_ids:
            stop_text = self.tokenizer.decode([sid], skip_special_tokens=False)
            if stop_text and after.startswith(stop_text):
                return stop_text, after[len(stop_text):]
        raise TemplateError(
            f"the chat template ends an assistant message with {after[:40]!r}, which does not start "
            f"with any stop token ({list(self.stop_token_ids)}); sampled turns could not be continued"
        )

    # --- public API ------------------------------------------------------------------
    @property
    def renders_tools(self) -> bool:
        """Whether the template renders ``tools=`` itself (else they go into the system prompt)."""
        return self._tools_rendered

    def initial_messages(self, system_prompt: str | None, user: str, tools: Sequence[dict] | None = None,
                         *, prompt_describes_tools: bool = False,
                         examples: Sequence[Message] | None = None) -> list[Message]:
        """The first messages of an episode: the system message, the env's worked example
        turns (``StepInfo.example_messages``) if any, then ``user``. When the template does
        not render ``tools=``, a plain-text description of the tools is appended to the
        system prompt, unless the environment says its system prompt already describes them."""
        system = system_prompt or ""
        if tools and not self._tools_rendered and not prompt_describes_tools:
            system = (system + "\n\n" + render_tools_for_prompt(tools)).strip()
        msgs: list[Message] = []
        if system:
            msgs.append({"role": "system", "content": system})
        msgs.extend({"role": m["role"], "content": m["content"]} for m in examples or ())
        msgs.append({"role": "user", "content": user})
        return msgs

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[dict] | None = None) -> list[int]:
        """Token ids of the full first prompt with the generation prompt. ``[P]`` ints."""
        return self._encode(self._render(messages, add_generation_prompt=True, tools=tools))

    def delta_ids(self, new_messages: Sequence[Message], *, completion_ended_with_stop: bool = True) -> list[int]:
        """Ids to append after a sampled completion (which ended with a stop token): the
        template's glue after that stop token, the new messages, and the generation prompt.

        Raises:
            TemplateError: the template does not render ``base + new`` as an extension of
                ``base`` (it rewrites earlier turns).
        """
        if not new_messages:
            raise ValueError("delta_ids needs at least one new message")
        base = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
        s_base = self._render(base, add_generation_prompt=False)
        s_full = self._render(base + list(new_messages), add_generation_prompt=True)
        if not s_full.startswith(s_base):
            raise TemplateError(
                "the chat template renders earlier turns differently once new messages follow; "
                "it cannot be extended turn by turn"
            )
        glue = self._glue if completion_ended_with_stop else self._end_text + self._glue
        return self._encode(glue + s_full[len(s_base):])

    def check_incremental(self, tools: Sequence[dict] | None = None, system_prompt: str | None = "You are a probe.") -> None:
        """Prove delta tokenization equals the full rendering on a probe conversation
        (assistant with two tool calls → tool result A → tool result B → assistant;
        docs/cases.md, C02). Completions are encoded from text here only because the probe's text
        round-trips; real completions never are.

        Raises:
            TemplateError: with the first differing position, if they differ.
        """
        call = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
        a1 = f"I will run two tools.\n{call}\n{call}"
        a2 = "Both results are in. The answer is 5."
        msgs = self.initial_messages(system_prompt, _PROBE_USER, tools)
        stream = self.prompt_ids(msgs, tools)
        stop = self.stop_token_ids[0]
        full_msgs = list(msgs)
        for content, followups in ((a1, [{"role": "tool", "content": "A"}, {"role": "tool", "content": "B"}]), (a2, None)):
            stream += self._encode(content) + [stop]
            full_msgs.append({"role": "assistant", "content": content})
            if followups:
                stream += self.delta_ids(followups)
                full_msgs.extend(followups)
        rendered = self._render(full_msgs, add_generation_prompt=False, tools=tools)
        # The full rendering ends with the template's glue after the last stop token.
        if self._glue and rendered.endswith(self._glue):
            rendered = rendered[: -len(self._glue)]
        expected = self._encode(rendered)
        if stream != expected:
            pos = next((i for i, (a, b) in enumerate(zip(stream, expected)) if a != b), min(len(stream), len(expected)))
            raise TemplateError(
                "turn-by-turn tokenization differs from the full chat-template rendering at token "
                f"{pos} (got {stream[pos:pos + 5]}, full rendering has {expected[pos:pos + 5]}); this "
                "template cannot be extended turn by turn"
            )


def render_tools_for_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """Describe JSON-schema tools in plain text, with the exact call format to use.

    For chat templates that do not render ``tools=`` themselves (small models' templates
    often do not). Example output for the python tool::

        Tool `python`: Run a Python 3 program ...
          Arguments:
          - code (string, required): The complete Python program to run.
        To call a tool, write:
        <tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>

    Returns ``""`` for no tools.

    Raises:
        ConfigError: a tool schema fails ``agentrl.types.tool_function`` (no function name,
            parameters or a property schema that is not a dict, ``required`` not a list of str).
    """
    if not tools:
        return ""
    lines: list[str] = []
    example: str | None = None
    for tool in tools:
        fn = tool_function(tool)
        desc = str(fn.get("description", "")).strip()
        lines.append(f"Tool `{fn['name']}`: {desc}" if desc else f"Tool `{fn['name']}`.")
        params = fn.get("parameters") or {}
        props: Mapping[str, Any] = params.get("properties") or {}
        required = set(params.get("required") or [])
        if props:
            lines.append("  Arguments:")
            for pname, pschema in props.items():
                ptype = pschema.get("type", "any")
                if isinstance(ptype, list):
                    ptype = " or ".join(map(str, ptype))
                flag = "required" if pname in required else "optional"
                pdesc = str(pschema.get("description", "")).strip()
                lines.append(f"  - {pname} ({ptype}, {flag}){': ' + pdesc if pdesc else ''}")
        else:
            lines.append("  Arguments: none.")
        if example is None:
            example_args = {p: "..." for p in props if p in required}
            example = json.dumps({"name": fn["name"], "arguments": example_args})
    lines.append("To call a tool, write:")
    lines.append(f"<tool_call>{example}</tool_call>")
    return "\n".join(lines)
