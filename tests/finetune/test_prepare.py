"""Race-free, cached, deterministic data preparation with a leak-free train/eval split."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from dataclasses import replace
from pathlib import Path

import pytest

from gpucert.finetune.config import DataConfig, FinetuneConfig, ModelConfig
from gpucert.finetune.glaive import parse_rows
from gpucert.finetune.prepare import (
    COLUMNS,
    READY,
    data_fingerprint,
    load_eval_conversations,
    prepare_dataset,
    split_conversations,
)
from gpucert.finetune.sample_data import generate_rows
from gpucert.finetune.template import IGNORE_INDEX
from gpucert.finetune.tokenizer import load_tokenizer


def config(cache: Path, **data: object) -> FinetuneConfig:
    fields = {"max_length": 384, "eval_fraction": 0.1, "max_rows": 120, "cache_dir": str(cache), **data}
    return FinetuneConfig(model=ModelConfig(name="tiny"), data=DataConfig(**fields))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ModelConfig(name="tiny"), DataConfig())


def digest(prepared) -> str:
    h = hashlib.sha256()
    for split in (prepared.train, prepared.eval):
        for row in split:
            h.update(json.dumps([row[c] for c in COLUMNS]).encode())
    return h.hexdigest()


def documents(dataset) -> list[tuple[int, ...]]:
    docs = []
    for row in dataset:
        start = 0
        for length in row["seq_lengths"]:
            docs.append(tuple(row["input_ids"][start : start + length]))
            start += length
    return docs


def test_prepare_builds_once_then_reuses_the_cache(tmp_path: Path, tokenizer) -> None:
    cfg = config(tmp_path)
    first = prepare_dataset(cfg, tokenizer)
    assert first.built and (first.path / READY).exists()
    assert first.path == tmp_path / first.fingerprint
    assert sorted(p.name for p in first.path.iterdir()) == [
        READY,
        "eval",
        "eval_conversations.jsonl",
        "stats.json",
        "train",
    ]
    again = prepare_dataset(cfg, tokenizer)
    assert not again.built and digest(again) == digest(first) and again.stats == first.stats
    assert first.train.column_names == list(COLUMNS)


def test_rows_are_packed_and_masked(tmp_path: Path, tokenizer) -> None:
    prepared = prepare_dataset(config(tmp_path), tokenizer)
    for row in prepared.train:
        n = len(row["input_ids"])
        assert n == len(row["labels"]) == len(row["position_ids"]) == sum(row["seq_lengths"]) <= 384
        starts = [i for i, p in enumerate(row["position_ids"]) if p == 0]
        assert all(row["labels"][i] == IGNORE_INDEX for i in starts)
        assert len(starts) == len(row["seq_lengths"])
    assert any(len(row["seq_lengths"]) > 1 for row in prepared.train)


def test_stats(tmp_path: Path, tokenizer) -> None:
    stats = prepare_dataset(config(tmp_path), tokenizer).stats
    assert (stats["rows"], stats["parsed"], stats["unparsable"]) == (120, 117, 3)
    assert len(stats["unparsable_examples"]) == 3
    train, evals = stats["train"], stats["eval"]
    assert train["conversations"] + evals["conversations"] == 117
    assert evals["conversations"] == pytest.approx(0.1 * 117, abs=3)
    for split in (train, evals):
        assert set(split) >= {
            "conversations",
            "documents",
            "rows",
            "tokens",
            "supervised_tokens",
            "supervised_share",
            "truncated",
            "dropped",
            "fill",
        }
        assert 0 < split["supervised_tokens"] < split["tokens"]
        assert split["supervised_share"] == split["supervised_tokens"] / split["tokens"]
    assert train["truncated"] > 0
    assert json.loads(json.dumps(stats)) == stats


def test_split_is_by_conversation_without_leakage(tmp_path: Path, tokenizer) -> None:
    prepared = prepare_dataset(config(tmp_path, max_rows=None), tokenizer)
    train_docs, eval_docs = set(documents(prepared.train)), set(documents(prepared.eval))
    assert train_docs and eval_docs
    assert not train_docs & eval_docs
    held = load_eval_conversations(prepared.path)
    assert len(held) == prepared.stats["eval"]["conversations"]


def test_split_is_deterministic_and_groups_repeated_prompts() -> None:
    conversations, _ = parse_rows(generate_rows())
    train, evals = split_conversations(conversations, 0.1, seed=1)
    assert (train, evals) == split_conversations(conversations, 0.1, seed=1)
    assert evals != split_conversations(conversations, 0.1, seed=2)[1]
    assert len(train) + len(evals) == len(conversations)

    def first_user(c):
        return next(m["content"].lower() for m in c.messages if m["role"] == "user")

    assert not {first_user(c) for c in train} & {first_user(c) for c in evals}
    assert split_conversations(conversations, 0.0, seed=1) == (conversations, [])


def test_fingerprint_covers_what_changes_the_data(tmp_path: Path, tokenizer) -> None:
    base = config(tmp_path)
    fingerprint = data_fingerprint(base, tokenizer)
    assert fingerprint == data_fingerprint(base, tokenizer) and len(fingerprint) == 64
    for change in ({"max_length": 512}, {"seed": 7}, {"packing": False}, {"eval_fraction": 0.2}, {"max_rows": 10}):
        assert data_fingerprint(replace(base, data=replace(base.data, **change)), tokenizer) != fingerprint
    alpaca = load_tokenizer(ModelConfig(name="tiny"), DataConfig(format="alpaca", template="alpaca"))
    assert data_fingerprint(base, alpaca) != fingerprint  # another template


def test_local_file_fingerprint_follows_the_file(tmp_path: Path, tokenizer) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(20, 2)))
    cfg = config(tmp_path / "cache", source=str(data), max_rows=None)
    before = data_fingerprint(cfg, tokenizer)
    prepared = prepare_dataset(cfg, tokenizer)
    assert prepared.stats["rows"] == 20
    data.write_text("".join(json.dumps(r) + "\n" for r in generate_rows(25, 2)))
    assert data_fingerprint(cfg, tokenizer) != before
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        prepare_dataset(config(tmp_path, source=str(tmp_path / "nope.jsonl")), tokenizer)


def test_without_packing_each_conversation_is_a_row(tmp_path: Path, tokenizer) -> None:
    prepared = prepare_dataset(config(tmp_path, packing=False), tokenizer)
    assert all(len(row["seq_lengths"]) == 1 for row in prepared.train)
    assert prepared.stats["train"]["rows"] == prepared.stats["train"]["documents"] - prepared.stats["train"]["dropped"]


def _prepare_in_process(cache: str, start, results) -> None:
    tokenizer = load_tokenizer(ModelConfig(name="tiny"), DataConfig())
    start.wait()  # all four reach the empty cache at the same moment, after their slow imports
    prepared = prepare_dataset(config(Path(cache)), tokenizer)
    results.put((prepared.built, digest(prepared)))


@pytest.mark.slow
def test_concurrent_processes_prepare_exactly_once(tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(4), ctx.Queue()
    workers = [ctx.Process(target=_prepare_in_process, args=(str(cache), start, results)) for _ in range(4)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert sum(built for built, _ in outcomes) == 1
    assert len({d for _, d in outcomes}) == 1
    assert [p.name for p in cache.iterdir() if ".tmp-" in p.name] == []


def test_synthetic_rows_are_full_length_single_documents(tmp_path: Path, tokenizer) -> None:
    cfg = config(tmp_path, source="synthetic", max_rows=40, max_length=64)
    prepared = prepare_dataset(cfg, tokenizer)
    assert (len(prepared.train), len(prepared.eval)) == (36, 4)
    for row in prepared.train:
        assert row["seq_lengths"] == [64] and row["position_ids"] == list(range(64))
        assert row["labels"] == [IGNORE_INDEX, *row["input_ids"][1:]]
        assert all(0 <= t < len(tokenizer) for t in row["input_ids"])
    assert prepared.stats["train"]["supervised_tokens"] == 36 * 63
    # Deterministic by seed, another seed another dataset.
    assert digest(
        prepare_dataset(config(tmp_path / "again", source="synthetic", max_rows=40, max_length=64), tokenizer)
    ) == digest(prepared)
    other = prepare_dataset(config(tmp_path, source="synthetic", max_rows=40, max_length=64, seed=7), tokenizer)
    assert other.fingerprint != prepared.fingerprint and digest(other) != digest(prepared)
