"""The Qwen2.5 tool template, assistant-only masks, and the shipped tiny tokenizer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tools.sample_data import generate_rows

from gpucert.finetune.config import DataConfig, ModelConfig
from gpucert.finetune.data.formats import alpaca_to_conversation
from gpucert.finetune.data.glaive import Conversation, parse_row, parse_rows
from gpucert.finetune.data.template import (
    IGNORE_INDEX,
    TemplateError,
    check_supervised,
    has_generation_markers,
    render,
    supervised_spans,
    supervised_text,
    template_hash,
    template_text,
)
from gpucert.finetune.data.tokenizer import (
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    load_tokenizer,
    tiny_tokenizer,
    train_tiny_tokenizer,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "finetune"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ModelConfig(name="tiny"), DataConfig(template="qwen2.5-tools"))


@pytest.fixture(scope="module")
def example() -> Conversation:
    return parse_row(json.loads((FIXTURES / "glaive_example.json").read_text()))


def test_rendered_prompt_matches_the_qwen2_5_format(tokenizer, example: Conversation) -> None:
    # The golden file was written by hand from Qwen2.5's format; serving (vLLM hermes) and BFCL expect it.
    text = tokenizer.apply_chat_template(example.messages, tools=example.tools, tokenize=False)
    assert text == (FIXTURES / "glaive_example_rendered.txt").read_text(encoding="utf-8")


def test_default_system_and_generation_prompt(tokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_consecutive_tool_results_share_one_user_turn_and_calls_are_separated(tokenizer) -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call, call]},
        {"role": "tool", "name": "f", "content": "A"},
        {"role": "tool", "name": "f", "content": "B"},
        {"role": "assistant", "content": "done"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n</tool_response><|im_end|>\n"
    ) in text


def test_string_arguments_are_not_double_encoded(tokenizer) -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    assert '{"name": "f", "arguments": {"x": 1}}' in tokenizer.apply_chat_template(messages, tokenize=False)


def test_mask_covers_exactly_the_assistant_output(tokenizer, example: Conversation) -> None:
    input_ids, labels = render(tokenizer, example)
    assert len(input_ids) == len(labels)
    assert supervised_text(tokenizer, input_ids, labels) == [
        '<tool_call>\n{"name": "convert_temperature", "arguments": {"value": 31, "to_unit": "F"}}\n</tool_call>'
        "<|im_end|>",
        "31 °C is 87.8 °F.<|im_end|>",
        "I'm sorry, I can't book taxis. I can only convert temperatures and look up tide times.<|im_end|>",
    ]
    assert all(label in (token, IGNORE_INDEX) for token, label in zip(input_ids, labels, strict=True))


def test_every_sample_conversation_renders_with_a_correct_mask(tokenizer) -> None:
    conversations, _ = parse_rows(generate_rows())
    supervised = total = 0
    for conv in conversations:
        _, labels = render(tokenizer, conv)  # render() checks each conversation's mask itself
        supervised += sum(label != IGNORE_INDEX for label in labels)
        total += len(labels)
    assert 0.05 < supervised / total < 0.5


def test_prefix_renders_when_the_template_has_no_generation_markers(tokenizer, example: Conversation) -> None:
    plain = re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template_text("qwen2.5-tools"))
    assert not has_generation_markers(plain) and has_generation_markers(template_text("qwen2.5-tools"))
    marked_ids, marked = render(tokenizer, example)
    original = tokenizer.chat_template
    tokenizer.chat_template = plain
    try:
        ids, labels = render(tokenizer, example)
    finally:
        tokenizer.chat_template = original
    assert ids == marked_ids
    # Prefix renders also take the newline after each <|im_end|>: one token more per assistant turn.
    newline = tokenizer.convert_tokens_to_ids("Ċ")
    marked_spans, spans = supervised_spans(marked), supervised_spans(labels)
    assert [(a, b + 1) for a, b in marked_spans] == spans
    assert all(ids[b - 1] == newline for _, b in spans)


def test_prefix_renders_locate_turns_by_characters_across_merged_tokens(tokenizer) -> None:
    # A Mistral-like template without markers whose prompt ends in a space: the answer's first word is tokenized
    # with it (" The"). Token prefixes would not line up; by characters the straddling token is supervised.
    original = tokenizer.chat_template
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST] "
        "{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
    )
    conv = Conversation(
        messages=[
            {"role": "user", "content": "Translate 'the cat sleeps' into French."},
            {"role": "assistant", "content": "The cat is asleep."},
            {"role": "user", "content": "And the weather?"},
            {"role": "assistant", "content": "It is sunny."},
        ]
    )
    try:
        input_ids, labels = render(tokenizer, conv)
    finally:
        tokenizer.chat_template = original
    assert supervised_text(tokenizer, input_ids, labels) == [" The cat is asleep.<|im_end|>", " It is sunny.<|im_end|>"]


def test_check_rejects_supervised_user_or_tool_text(tokenizer, example: Conversation) -> None:
    input_ids, labels = render(tokenizer, example)
    with pytest.raises(TemplateError, match="found none"):
        check_supervised(tokenizer, input_ids, [IGNORE_INDEX] * len(labels), example)
    with pytest.raises(TemplateError):
        check_supervised(tokenizer, input_ids, list(input_ids), example)  # everything supervised
    user_start = input_ids.index(tokenizer.convert_tokens_to_ids("<|im_start|>"), 1)
    leaky = list(labels)
    # Supervise the whole user turn after the system prompt (but not its header token).
    user_end = input_ids.index(tokenizer.convert_tokens_to_ids(EOS_TOKEN), user_start)
    leaky[user_start + 1 : user_end] = input_ids[user_start + 1 : user_end]
    with pytest.raises(TemplateError, match="user text"):
        check_supervised(tokenizer, input_ids, leaky, example)


def test_alpaca_without_a_tokenizer_template_supervises_the_response_only() -> None:
    tokenizer = load_tokenizer(ModelConfig(name="tiny"), DataConfig(format="alpaca", template="tokenizer"))
    conv = alpaca_to_conversation(
        {"instruction": "Translate the sentence into French.", "input": "The cat sleeps.", "output": "Le chat dort."}
    )
    input_ids, labels = render(tokenizer, conv)
    prompt = tokenizer.decode(input_ids)
    assert (
        "### Instruction:\nTranslate the sentence into French.\n\n### Input:\nThe cat sleeps.\n\n### Response:\n"
        in prompt
    )
    assert "paired with an input" in prompt
    assert supervised_text(tokenizer, input_ids, labels) == ["Le chat dort." + EOS_TOKEN]


def test_template_hash_follows_the_text() -> None:
    assert template_hash() == template_hash(template_text("qwen2.5-tools"))
    assert template_hash("a") != template_hash("b")
    assert len(template_hash()) == 64


def test_load_tokenizer_options() -> None:
    with pytest.raises(ValueError, match=r"data\.template"):
        load_tokenizer(ModelConfig(name="tiny"), DataConfig(template="chatml-9000"))
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(ModelConfig(name="tiny"), DataConfig(format="glaive", template="tokenizer"))
    # A model directory with only a config.json (the speed recipe) gets the tiny tokenizer.
    config_only = Path(__file__).parents[2] / "configs" / "finetune" / "models" / "qwen2-7b"
    tokenizer = load_tokenizer(ModelConfig(name=str(config_only)), DataConfig())
    assert tokenizer.name_or_path == "tiny"


def test_shipped_tiny_tokenizer_has_the_qwen_special_tokens() -> None:
    tokenizer = tiny_tokenizer()
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert (tokenizer.pad_token, tokenizer.eos_token) == (PAD_TOKEN, EOS_TOKEN)
    assert 1000 < len(tokenizer) <= 4096
    text = "<|im_start|>user\nWhat's 31 °C in °F? ¿Dónde está?<|im_end|>\n"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert ids[0] == 1 and 2 in ids


def test_train_tiny_tokenizer_on_a_slice(tmp_path: Path) -> None:
    texts = [row["system"] + "\n" + row["chat"] for row in generate_rows(40, 3)]
    path = tmp_path / "tok.json"
    train_tiny_tokenizer(texts, path, vocab_size=600)
    tokenizer = tiny_tokenizer(path)
    assert len(tokenizer) <= 600
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    sample = texts[0][:300] + "<|im_end|>"
    ids = tokenizer(sample)["input_ids"]
    assert tokenizer.decode(ids) == sample
    assert len(ids) < len(sample.encode()) / 2  # merges learned
