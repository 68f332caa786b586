"""Race-free, cached, deterministic data preparation with a leak-free train/eval split."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tools.sample_data import generate_rows

from gpucert.finetune.config import DataConfig, FinetuneConfig, ModelConfig
from gpucert.finetune.data import prepare as prepare_module
from gpucert.finetune.data.formats import DataError
from gpucert.finetune.data.glaive import parse_rows
from gpucert.finetune.data.prepare import (
    COLUMNS,
    DATA_METHOD_VERSION,
    READY,
    data_fingerprint,
    load_eval_conversations,
    prepare_dataset,
    report_lines,
    split_conversations,
)
from gpucert.finetune.data.template import IGNORE_INDEX
from gpucert.finetune.data.tokenizer import load_tokenizer


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
        "files.json",
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
    assert stats["data_method_version"] == DATA_METHOD_VERSION == "3"
    # Each data-quality case of the parser, with examples naming the row and its line in the source file.
    assert {case: t["count"] for case, t in stats["dropped"].items()} == {
        "bad_arguments": 2,
        "duplicate_assistant_turns": 1,
    }
    assert stats["dropped"]["bad_arguments"]["examples"][0]["at"].startswith("glaive_sample.jsonl:")
    assert set(stats["repaired"]) == {"merged_assistant_turns", "python_literal_arguments"}
    assert (stats["lines"], stats["bad_lines"], stats["bad_line_examples"]) == (120, 0, [])
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


def test_a_wait_on_another_preparation_is_said_and_ends_naming_the_holder(
    tmp_path: Path, tokenizer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A preparation hung on another node once kept every rank waiting silently, without end."""
    cfg = config(tmp_path, lock_timeout_s=1.0)
    fingerprint = data_fingerprint(cfg, tokenizer)
    lock = tmp_path / f"{fingerprint}.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        (tmp_path / f"{fingerprint}.holder.json").write_text(
            json.dumps({"pid": holder.pid, "host": "node-b", "since": 0, "source": "glaive.jsonl"})
        )
        monkeypatch.setattr(prepare_module, "LOCK_NOTICE_S", 0.2)
        with pytest.raises(DataError) as stopped:
            prepare_dataset(cfg, tokenizer)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    said = f"pid {holder.pid} on node-b since 00:00:00 UTC, preparing glaive.jsonl"
    assert f"waiting up to 1 s (data.lock_timeout_s) for {lock}: {said}" in caplog.text
    assert str(stopped.value).startswith(
        f"data.cache_dir: {lock} is still held after 1 s (data.lock_timeout_s) by {said}"
    )
    assert not (tmp_path / fingerprint).exists()
    # The holder gone, its lock goes with it: the next run prepares, and leaves no note behind.
    assert prepare_dataset(cfg, tokenizer).built
    assert not (tmp_path / f"{fingerprint}.holder.json").exists()


# Holds a preparation lock (as another process preparing would) until killed.
HOLD_LOCK = """
import sys
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()
"""


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


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def leftovers(cache: Path) -> list[str]:
    """What a refused preparation left in the cache: no entry, no READY marker, no temporary directory."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) if cache.exists() else []


def refuse(cfg: FinetuneConfig, tokenizer) -> str:
    """The refusal's message; a rerun (nothing cached) refuses the same way, never with an IndexError."""
    with pytest.raises(DataError) as first:
        prepare_dataset(cfg, tokenizer)
    assert leftovers(Path(cfg.data.cache_dir)) == []
    with pytest.raises(DataError) as again:
        prepare_dataset(cfg, tokenizer)
    assert str(again.value) == str(first.value)
    return str(first.value)


def test_an_empty_eval_split_is_refused_before_anything_is_cached(tmp_path: Path, tokenizer) -> None:
    message = refuse(config(tmp_path / "cache", max_rows=1), tokenizer)
    assert "eval split is empty" in message and "data.eval_fraction=0.1" in message
    assert "1 usable conversation" in message and "raise data.eval_fraction or data.max_rows" in message


def test_conversations_that_all_share_one_prompt_cannot_be_split(tmp_path: Path, tokenizer) -> None:
    source = write_rows(tmp_path / "same.jsonl", [generate_rows(1, 3)[0]] * 5)
    message = refuse(config(tmp_path / "cache", source=str(source), max_rows=None), tokenizer)
    assert "eval split is empty" in message and "1 group" in message


def test_every_row_unusable_is_refused_with_the_counts_per_reason(tmp_path: Path, tokenizer) -> None:
    rows = [{"system": "SYSTEM: hi", "chat": "hello there"}] * 4 + [{"system": "SYSTEM: hi", "chat": "USER: x"}] * 2
    source = write_rows(tmp_path / "bad.jsonl", rows)
    message = refuse(config(tmp_path / "cache", source=str(source), max_rows=None), tokenizer)
    assert "no usable conversation" in message and str(source) in message
    assert "6 rows" in message and "no_leading_turn 4" in message and "no_assistant_turn 2" in message
    assert "bad.jsonl:1" in message and "data.format" in message


def test_every_conversation_over_max_length_is_refused_naming_the_split_and_the_length(
    tmp_path: Path, tokenizer
) -> None:
    message = refuse(config(tmp_path / "cache", max_length=8), tokenizer)
    assert "train split has no rows" in message and "data.max_length=8" in message
    assert "nothing supervised in their first 8 tokens" in message and "raise data.max_length: at " in message


def test_a_failed_build_leaves_no_temporary_directory(tmp_path: Path, tokenizer, monkeypatch) -> None:
    from gpucert.finetune.data import prepare

    def broken(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(prepare, "pack", broken)
    cache = tmp_path / "cache"
    with pytest.raises(OSError, match="disk full"):
        prepare_dataset(config(cache), tokenizer)
    assert leftovers(cache) == []


def test_bad_lines_are_skipped_counted_and_reported(tmp_path: Path, tokenizer) -> None:
    lines = [json.dumps(r) for r in generate_rows(150, 2)]
    lines[9] = lines[9][:50]  # a line cut short
    source = tmp_path / "rows.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepared = prepare_dataset(config(tmp_path / "cache", source=str(source), max_rows=None), tokenizer)
    stats = prepared.stats
    assert (stats["lines"], stats["bad_lines"], stats["rows"]) == (150, 1, 149)
    assert stats["bad_line_examples"][0].startswith("rows.jsonl:10: ")
    text = "\n".join(report_lines(stats))
    assert "1 of 150 lines skipped" in text and "rows.jsonl:10" in text
    for case in (*stats["dropped"], *stats["repaired"]):
        assert case in text


def test_report_lines_count_each_case_with_examples(tmp_path: Path, tokenizer) -> None:
    quirks = Path(__file__).parents[1] / "fixtures" / "finetune" / "glaive_quirks.jsonl"
    source = write_rows(tmp_path / "quirks.jsonl", [json.loads(line) for line in quirks.read_text().splitlines()] * 4)
    stats = prepare_dataset(config(tmp_path / "cache", source=str(source), max_rows=None), tokenizer).stats
    text = "\n".join(report_lines(stats))
    for case in ("stray_role_marker", "undeclared_function", "non_finite_number", "conflicting_function"):
        assert f"dropped {case}: {stats['dropped'][case]['count']}" in text
    for case in ("arguments_key", "json_escape_in_literal", "duplicate_function", "truncated_final_turn"):
        assert f"repaired {case}: {stats['repaired'][case]['count']}" in text
    assert "quirks.jsonl:" in text


def test_prepare_command_refuses_bad_data_with_exit_3_and_prints_the_report(tmp_path: Path, capsys) -> None:
    from gpucert.cli import main

    cache = f"data.cache_dir={tmp_path / 'cache'}"
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"system": "SYSTEM: x", "chat": "USER: a"}\n{not json\n')
    assert main(["finetune", "prepare", "--set", f"data.source={broken}", "--set", cache]) == 3
    err = capsys.readouterr().err
    assert f"{broken}: 1 of 2 lines (50.0%)" in err and "data.max_bad_row_share=0.01" in err
    assert main(["finetune", "prepare", "--set", "data.max_rows=1", "--set", cache]) == 3
    assert "eval split is empty" in capsys.readouterr().err
    assert leftovers(tmp_path / "cache") == []
    assert main(["finetune", "prepare", "--set", cache]) == 0
    out = capsys.readouterr().out
    assert "dropped bad_arguments: 5" in out and "glaive_sample.jsonl:40 (row 39)" in out


def test_a_prepared_cache_cut_short_is_refused_naming_the_file_never_trained_on(tmp_path: Path, tokenizer) -> None:
    """A train file cut at a record batch's end loaded as fewer rows without a word (a run trained on 5,000 of
    16,260 rows and its report said 16,260); a file cut mid-batch, a garbled stats.json or a held-out file cut
    mid-line were tracebacks naming no file."""
    import shutil

    from datasets import load_from_disk

    cfg = config(tmp_path / "cache")
    path = prepare_dataset(cfg, tokenizer).path
    pristine = tmp_path / "pristine"
    shutil.copytree(path, pristine)

    def damaged(said: str) -> None:
        with pytest.raises(DataError, match=said) as refused:
            prepare_dataset(cfg, tokenizer)
        assert f"the prepared data in {path} is damaged" in str(refused.value)
        assert "remove that directory and run again" in str(refused.value)
        shutil.rmtree(path)
        shutil.copytree(pristine, path)

    [arrow] = sorted((path / "train").glob("*.arrow"))
    with open(arrow, "r+b") as f:
        f.truncate(arrow.stat().st_size // 2)
    damaged(rf"train/{arrow.name} has [\d,]+ bytes, [\d,]+ when it was prepared")
    (path / "stats.json").write_text("{not json")
    damaged(r"stats.json has \d+ bytes")
    # Fewer rows, each file whole (a cache of an older gpucert keeps no sizes): held to stats.json's count.
    load_from_disk(str(path / "train")).select(range(3)).save_to_disk(str(tmp_path / "fewer"))
    shutil.rmtree(path / "train")
    shutil.move(tmp_path / "fewer", path / "train")
    (path / "files.json").unlink()
    damaged(r"train/ holds 3 rows, stats.json says \d+ were prepared")
    held_out = path / "eval_conversations.jsonl"
    lines = held_out.read_text().splitlines()
    (path / "files.json").unlink()
    held_out.write_text(lines[0] + "\n" + lines[1][:40] + "\n")
    with pytest.raises(DataError, match=r"eval_conversations.jsonl:2: "):
        load_eval_conversations(path)
    held_out.write_text(lines[0] + "\n")
    with pytest.raises(DataError, match=rf"holds 1 conversations, {len(lines)} were prepared"):
        load_eval_conversations(path)


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_during_preparation_leaves_nothing_in_the_cache(tmp_path: Path) -> None:
    """SIGTERM's watch ends the process with os._exit, past the build's own clean-up: the temporary directory
    and the lock's note stayed until the next preparation of that data."""
    import signal
    import time

    source = tmp_path / "big.jsonl"
    sample = Path(prepare_module.__file__).parent / "assets" / "glaive_sample.jsonl"
    source.write_text(sample.read_text() * 30)
    cache = tmp_path / "cache"
    argv = [sys.executable, "-m", "gpucert", "finetune", "--set", f"data.source={source}"]
    argv += ["--set", f"data.cache_dir={cache}", "--output", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(cache.glob("*.tmp-*")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert list(cache.glob("*.tmp-*")), "the preparation never started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        proc.kill()
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_held_out_conversations_with_unicode_line_separators_and_synthetic_rows_load(tmp_path: Path, tokenizer) -> None:
    """A conversation whose text holds U+2028 (scraped text does) was split there and refused as damaged, for
    good; a synthetic cache (rows, no conversations) was refused as "holds 0 conversations, N were prepared"."""
    path = prepare_dataset(config(tmp_path / "cache"), tokenizer).path
    held_out = path / "eval_conversations.jsonl"
    first = json.loads(held_out.read_text().split("\n")[0])
    first["messages"][0]["content"] += " line\u2028separator\u0085next"
    rest = held_out.read_text().split("\n")[1:]
    held_out.write_text("\n".join([json.dumps(first, ensure_ascii=False), *rest]))
    assert "\u2028" in load_eval_conversations(path)[0].messages[0]["content"]
    synthetic = prepare_dataset(config(tmp_path / "cache", source="synthetic", max_rows=20), tokenizer)
    assert load_eval_conversations(synthetic.path) == []
