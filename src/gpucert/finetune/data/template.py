"""Chat templates and rendering a conversation to token ids with an assistant-only loss mask.

The mask comes from the template's `{% generation %}` spans (`apply_chat_template(...,
return_assistant_tokens_mask=True)`); for a tokenizer template without them, from successive renders of message
prefixes. Never from scanning for role markers, which breaks when content contains them. Every rendered
conversation is checked: something is supervised, the supervised text holds each assistant message, and no
user, system or tool text is supervised (shared reference `fine-tuning.md` §7).
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from pathlib import Path
from typing import Any

from gpucert.finetune.data.glaive import Conversation

ASSETS = Path(__file__).parent / "assets"
# Template names of DataConfig.template that gpucert ships; "tokenizer" keeps the model's own.
SHIPPED_TEMPLATES = {"qwen2.5-tools": "qwen2_5_tools.jinja", "alpaca": "alpaca.jinja"}
IGNORE_INDEX = -100
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
# Non-assistant text shorter than this may legitimately recur inside an answer ("Yes", "Paris").
_MIN_LEAK_CHARS = 12


class TemplateError(ValueError):
    """The template cannot render this conversation, or its mask is wrong."""


@cache
def template_text(name: str) -> str:
    """The text of a shipped template: "qwen2.5-tools" or "alpaca"."""
    if name not in SHIPPED_TEMPLATES:
        raise ValueError(f"unknown template {name!r}: gpucert ships {sorted(SHIPPED_TEMPLATES)}")
    return (ASSETS / SHIPPED_TEMPLATES[name]).read_text(encoding="utf-8")


def template_hash(text: str | None = None) -> str:
    """sha256 of a template's text (default: the shipped Qwen2.5 tool template), for data fingerprints."""
    return hashlib.sha256((template_text("qwen2.5-tools") if text is None else text).encode("utf-8")).hexdigest()


def has_generation_markers(text: str) -> bool:
    return bool(_GENERATION_TAG.search(text))


def active_template(tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> str:
    """The template text apply_chat_template would use (tokenizers may hold several, by name)."""
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat template; set data.template to 'qwen2.5-tools' "
            "(function calling) or 'alpaca'"
        )
    return str(tokenizer.get_chat_template(None, tools))


def _text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kw: Any) -> str:
    return str(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kw))


def _prefix_mask(tokenizer: Any, conv: Conversation) -> tuple[list[int], list[int]]:
    """Assistant spans from successive renders: the text message i adds when it is an assistant turn, located
    by characters (as the generation markers are), so a token that merges across a turn boundary is no problem."""
    tools = conv.tools or None
    full = _text(tokenizer, conv.messages, tools)
    spans = []
    for i, message in enumerate(conv.messages):
        if message["role"] != "assistant":
            continue
        before = _text(tokenizer, conv.messages[:i], tools, add_generation_prompt=True) if i else ""
        upto = _text(tokenizer, conv.messages[: i + 1], tools)
        if not upto.startswith(before) or not full.startswith(upto):
            raise TemplateError(
                f"template of {tokenizer.name_or_path!r} renders earlier turns differently once later turns are "
                "added, so prefix renders cannot locate assistant turns; use a template with {% generation %} "
                "markers (data.template: qwen2.5-tools)"
            )
        if len(upto) > len(before):
            spans.append((len(before), len(upto)))
    encoding = tokenizer(full, add_special_tokens=False)
    input_ids = list(encoding["input_ids"])
    mask = [0] * len(input_ids)
    for start, end in spans:
        # Some tokenizers map no token to a character (a space folded into the next piece): take the first and
        # last characters of the span that have one.
        first = next((t for t in map(encoding.char_to_token, range(start, end)) if t is not None), None)
        last = next((t for t in map(encoding.char_to_token, range(end - 1, start - 1, -1)) if t is not None), None)
        if first is None or last is None:
            raise TemplateError(f"assistant text at characters {start}..{end} maps to no token")
        mask[first : last + 1] = [1] * (last + 1 - first)
    return input_ids, mask


def render(tokenizer: Any, conv: Conversation) -> tuple[list[int], list[int]]:
    """Token ids and labels (the id where the assistant wrote it, else -100) of one conversation."""
    tools = conv.tools or None
    if has_generation_markers(active_template(tokenizer, tools)):
        out = tokenizer.apply_chat_template(
            conv.messages,
            tools=tools,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        input_ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    else:
        input_ids, mask = _prefix_mask(tokenizer, conv)
    labels = [token if keep else IGNORE_INDEX for token, keep in zip(input_ids, mask, strict=True)]
    if any(m["role"] == "assistant" for m in conv.messages):
        check_supervised(tokenizer, input_ids, labels, conv)
    return input_ids, labels


def supervised_spans(labels: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of supervised positions."""
    spans = []
    start = None
    for i, label in enumerate([*labels, IGNORE_INDEX]):
        if label != IGNORE_INDEX and start is None:
            start = i
        elif label == IGNORE_INDEX and start is not None:
            spans.append((start, i))
            start = None
    return spans


def supervised_text(tokenizer: Any, input_ids: list[int], labels: list[int]) -> list[str]:
    """The decoded text of each supervised span."""
    return [
        tokenizer.decode(input_ids[a:b], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        for a, b in supervised_spans(labels)
    ]


def check_supervised(
    tokenizer: Any, input_ids: list[int], labels: list[int], conv: Conversation, complete: bool = True
) -> None:
    """Raise TemplateError unless the supervised tokens are assistant text only. With `complete`, every
    assistant message's text and call names must be supervised too (False after truncation)."""
    texts = supervised_text(tokenizer, input_ids, labels)
    where = f"in a conversation starting {_first_user(conv)!r}"
    if not texts:
        raise TemplateError(f"expected supervised assistant tokens, found none {where}")
    supervised = "\n".join(texts)
    assistant = [m for m in conv.messages if m["role"] == "assistant"]
    answers = "\n".join(str(m.get("content") or "") for m in assistant)
    for text in texts:
        if "<|im_start|>" in text:
            raise TemplateError(f"a supervised span contains a turn header: {text[:80]!r} {where}")
    for message in conv.messages:
        content = str(message.get("content") or "").strip()
        if message["role"] == "assistant":
            if complete and content and content not in supervised:
                raise TemplateError(f"expected assistant text {content[:60]!r} to be supervised {where}")
            for call in message.get("tool_calls") or []:
                name = call.get("function", call)["name"]
                if complete and name not in supervised:
                    raise TemplateError(f"expected the call to {name!r} to be supervised {where}")
        elif len(content) >= _MIN_LEAK_CHARS and content in supervised and content not in answers:
            raise TemplateError(f"{message['role']} text {content[:60]!r} is supervised {where}")


def _first_user(conv: Conversation) -> str:
    return next((str(m.get("content"))[:60] for m in conv.messages if m["role"] == "user"), "")
