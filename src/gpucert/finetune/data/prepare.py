"""Race-free data preparation: load, convert, split, tokenize, pack, and cache by fingerprint.

Every rank calls `prepare_dataset`. The first to take the file lock `<cache_dir>/<fingerprint>.lock` builds the
data into a temporary directory and renames it to `<cache_dir>/<fingerprint>/` with a `READY` marker written
last; the others wait on the lock, then load. It is a plain file lock, not a torch.distributed barrier: minutes
of CPU work must not run into the NCCL watchdog (shared reference `fine-tuning.md` §11.1). For multi-node runs
put data.cache_dir on the shared filesystem, or run the preparation once before launching.

Cache directory:
    train/, eval/                 datasets.save_to_disk: input_ids, labels, position_ids, seq_lengths (int32 lists)
    stats.json                    rows, parsed, unparsable (+ examples); lines and bad_lines (+ file:line
                                  examples) of a local file; dropped and repaired rows by data-quality case,
                                  each {count, examples: [{row, at, excerpt}]} (docs/finetune-data.md); and per
                                  split ("train", "eval"): conversations, documents, rows, tokens,
                                  supervised_tokens, supervised_share, truncated, dropped, no_assistant,
                                  render_failures, fill
    eval_conversations.jsonl      held-out conversations (messages + tools), for generation-based evaluation
    files.json                    every file above and its size: a load checks them, and each split's rows
                                  against stats.json (a cache cut short is refused, naming the file)
    READY                         written last

Data that cannot make both splits (no usable row, an empty split, every conversation too long) is refused with a
DataError naming the split, the counts of what was dropped and why, and what to change; the temporary directory
of a build that fails for any reason is removed, so nothing half-written is left and a rerun starts afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import torch
from datasets import Dataset, DatasetInfo, Features, List, Value, load_from_disk
from datasets.table import InMemoryTable
from filelock import FileLock, Timeout

from gpucert.finetune.config import DataConfig, FinetuneConfig
from gpucert.finetune.data.formats import DataError, load_conversations, source_path
from gpucert.finetune.data.glaive import Conversation, ParseReport
from gpucert.finetune.data.packing import Document, PackStats, pack
from gpucert.finetune.data.template import IGNORE_INDEX, TemplateError, render, template_hash
from gpucert.finetune.disk import NoSpaceError, is_no_space, no_space_message

# Bumped whenever parsing, rendering, masking, splitting or packing changes what a prepared dataset holds.
# 2: the Glaive data rules of docs/finetune-data.md (repairs and drops by case), local JSON read line by line.
# 3: a call written in another syntax is read as a call or drops the row; stray end-of-text markers counted.
DATA_METHOD_VERSION = "3"
READY = "READY"
# Each file of a prepared dataset and its size, written before READY (_check_files).
FILES = "files.json"
# data.source of the throughput benchmark: random tokens, one full-length document per row, every token labelled
# (the unpadded mock data of published LoRA throughput figures, fine-tuning.md §3).
SYNTHETIC = "synthetic"
SYNTHETIC_ROWS = 512
COLUMNS = ("input_ids", "labels", "position_ids", "seq_lengths")
FEATURES = Features({name: List(Value("int32")) for name in COLUMNS})
# Conversations the template cannot render with a correct mask are skipped and counted; more than this share
# means the template or the data is wrong, and preparation stops.
MAX_RENDER_FAILURE_SHARE = 0.01
MAX_EXAMPLES = 10
# Examples named in a refusal.
REFUSAL_EXAMPLES = 3

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    train: Dataset
    eval: Dataset
    stats: dict[str, Any]
    fingerprint: str
    path: Path
    # True in the one process that built the cache during this call; False where it was loaded.
    built: bool = False


def source_identity(data_cfg: DataConfig) -> dict[str, Any]:
    """What identifies the data: a local file by path, size and mtime; the bundled sample by its content; a hub
    dataset by id and split."""
    if data_cfg.source == SYNTHETIC:
        return {"synthetic": True}
    path = source_path(data_cfg)
    if data_cfg.source == "sample" and path is not None:
        return {"sample": hashlib.sha256(path.read_bytes()).hexdigest()}
    if path is not None:
        if not path.exists():
            raise FileNotFoundError(f"data.source: file {path} not found")
        stat = path.stat()
        return {"file": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return {"hub": data_cfg.source, "split": data_cfg.split}


def vocab_hash(tokenizer: Any) -> str:
    content = {"vocab": sorted(tokenizer.get_vocab().items()), "special": tokenizer.special_tokens_map}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def data_fingerprint(cfg: FinetuneConfig, tokenizer: Any) -> str:
    data = cfg.data
    template = tokenizer.chat_template
    key = {
        "source": source_identity(data),
        "format": data.format,
        "tokenizer": cfg.model.name,
        "vocab": vocab_hash(tokenizer),
        "template": template_hash(template if isinstance(template, str) else json.dumps(template, sort_keys=True)),
        "max_length": data.max_length,
        "packing": data.packing,
        "eval_fraction": data.eval_fraction,
        "seed": data.seed,
        "max_rows": data.max_rows,
        "method": DATA_METHOD_VERSION,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _split_key(conv: Conversation) -> str:
    # Conversations that open with the same (normalised) user prompt go to the same side, so duplicates and
    # near-duplicates cannot leak from train into eval.
    first = next((m for m in conv.messages if m["role"] == "user"), None)
    if first is None:
        return json.dumps(conv.to_json(), sort_keys=True)
    return " ".join(str(first["content"]).lower().split())


def split_conversations(
    conversations: Sequence[Conversation], eval_fraction: float, seed: int
) -> tuple[list[Conversation], list[Conversation]]:
    """(train, eval) by whole conversation groups, deterministic for a seed; eval gets about eval_fraction."""
    groups: dict[str, list[int]] = {}
    for index, conv in enumerate(conversations):
        groups.setdefault(_split_key(conv), []).append(index)
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    total = len(conversations)
    target = max(1, round(eval_fraction * total)) if eval_fraction > 0 and total > 1 else 0
    held: set[int] = set()
    for key in keys:
        if len(held) >= target:
            break
        if len(held) + len(groups[key]) < total:  # never hold out everything
            held.update(groups[key])
    train = [c for i, c in enumerate(conversations) if i not in held]
    evals = [c for i, c in enumerate(conversations) if i in held]
    return train, evals


def _cases_text(cases: Mapping[str, Mapping[str, Any]]) -> str:
    """ "no_leading_turn 4, no_assistant_turn 2" from stats' dropped or repaired, most frequent first."""
    ordered = sorted(cases.items(), key=lambda item: (-item[1]["count"], item[0]))
    return ", ".join(f"{case} {tally['count']}" for case, tally in ordered)


def _example_text(example: Mapping[str, Any]) -> str:
    where = f"{example['at']} (row {example['row']})" if example.get("at") else f"row {example['row']}"
    return f"{where}: {example['excerpt']}"


def check_usable(data: DataConfig, report: ParseReport, conversations: Sequence[Conversation]) -> None:
    """Refuse a source of which no row converted: the counts per reason say whether the format is wrong."""
    if conversations:
        return
    summary = report.as_dict()
    examples = [e for tally in summary["dropped"].values() for e in tally["examples"]][:REFUSAL_EXAMPLES]
    raise DataError(
        f"data.source {source_path(data) or data.source}: no usable conversation: {report.total} rows read, all "
        f"dropped by the {data.format!r} parser ({_cases_text(summary['dropped'])}); first: "
        f"{'; '.join(_example_text(e) for e in examples)}. Check that data.format ({data.format}) is the file's "
        "format; docs/finetune-data.md says what each case means"
    )


def check_split(
    name: str, conversations: Sequence[Conversation], everything: Sequence[Conversation], eval_fraction: float
) -> None:
    """Refuse an empty split: training evaluates on eval, and `gpucert evaluate` generates from it."""
    if conversations:
        return
    groups = len({_split_key(c) for c in everything})
    raise DataError(
        f"{name} split is empty: {len(everything)} usable conversation(s) in {groups} group(s) (conversations "
        f"that open with the same user prompt stay on one side of the split), and data.eval_fraction="
        f"{eval_fraction} leaves {name} none of them; raise data.eval_fraction or data.max_rows, or add rows "
        "with other prompts"
    )


def _first_supervised(doc: Document) -> int | None:
    """Tokens a row needs to keep one supervised label of doc (its position 0 never is: the first-token rule)."""
    return next((i + 1 for i, label in enumerate(doc[1]) if i > 0 and label != IGNORE_INDEX), None)


def check_rows(
    name: str, conversations: int, docs: Sequence[Document], counts: dict[str, Any], data: DataConfig
) -> None:
    """Refuse a split that packed no row, with what became of its conversations and the max_length it needs."""
    lengths = [n for n in (_first_supervised(d) for d in docs) if n is not None]
    reasons = [
        f"{counts['no_assistant']} without an assistant turn",
        f"{counts['render_failures']} failed rendering",
        f"{len(docs)} longer than data.max_length={data.max_length} with nothing supervised in their first "
        f"{data.max_length} tokens",
    ]
    if lengths:
        advice = (
            f"raise data.max_length: at {min(lengths)} tokens one conversation keeps a supervised token, at "
            f"{min(len(d[0]) for d in docs)} the shortest fits whole"
        )
    else:
        advice = "check data.template and the data: no conversation has an assistant turn to supervise"
    raise DataError(f"{name} split has no rows: of {conversations} conversations, {', '.join(reasons)}; {advice}")


def tokenize_conversations(tokenizer: Any, conversations: Sequence[Conversation]) -> tuple[list[Document], dict]:
    """Render every conversation with an assistant turn; the rest and render failures are counted."""
    docs: list[Document] = []
    counts: dict[str, Any] = {"no_assistant": 0, "render_failures": 0, "render_failure_examples": []}
    for index, conv in enumerate(conversations):
        if not any(m["role"] == "assistant" for m in conv.messages):
            counts["no_assistant"] += 1
            continue
        try:
            docs.append(render(tokenizer, conv))
        except TemplateError as exc:
            counts["render_failures"] += 1
            if len(counts["render_failure_examples"]) < MAX_EXAMPLES:
                counts["render_failure_examples"].append([index, str(exc)])
    if counts["render_failures"] > MAX_RENDER_FAILURE_SHARE * max(len(conversations), 1):
        raise TemplateError(
            f"expected at most {MAX_RENDER_FAILURE_SHARE:.0%} of conversations to fail rendering, found "
            f"{counts['render_failures']} of {len(conversations)}; first: {counts['render_failure_examples'][0][1]}"
        )
    return docs, counts


def _dataset(rows: list[dict[str, Any]], fingerprint: str) -> Dataset:
    """The rows as a Dataset named by our own fingerprint. Dataset.from_dict would hash the whole in-memory
    table with dill to name it: slow on a large dataset, and it fails outright on some Python 3.12 stacks
    (PicklingError on pyarrow's MonthDayNano, seen on the lent GPU machine)."""
    arrays = {name: pa.array([row[name] for row in rows], type=pa.list_(pa.int32())) for name in COLUMNS}
    return Dataset(InMemoryTable.from_pydict(arrays), info=DatasetInfo(features=FEATURES), fingerprint=fingerprint)


def _split_stats(conversations: int, counts: dict[str, Any], pack_stats: PackStats, max_length: int) -> dict:
    stats: dict[str, Any] = {"conversations": conversations, **counts, **pack_stats.as_dict()}
    stats["supervised_share"] = pack_stats.supervised_tokens / max(pack_stats.tokens, 1)
    # Share of row slots holding tokens if every row were padded to max_length.
    stats["fill"] = pack_stats.tokens / max(pack_stats.rows * max_length, 1)
    return stats


def synthetic_rows(vocab_size: int, rows: int, length: int, seed: int) -> list[dict[str, list[int]]]:
    """Rows of `length` random token ids in [0, vocab_size), each one document, every token but the first
    labelled: a throughput workload with the shape of real data and no meaning."""
    g = torch.Generator().manual_seed(seed)
    positions = list(range(length))
    return [
        {"input_ids": ids, "labels": [IGNORE_INDEX, *ids[1:]], "position_ids": positions, "seq_lengths": [length]}
        for ids in torch.randint(0, vocab_size, (rows, length), generator=g).tolist()
    ]


def _build_synthetic(cfg: FinetuneConfig, tokenizer: Any, fingerprint: str, tmp: Path) -> dict[str, Any]:
    data = cfg.data
    total = data.max_rows or SYNTHETIC_ROWS
    held = round(data.eval_fraction * total)
    rows = synthetic_rows(len(tokenizer), total, data.max_length, data.seed)
    stats: dict[str, Any] = {"fingerprint": fingerprint, "data_method_version": DATA_METHOD_VERSION}
    stats.update({"source": SYNTHETIC, "max_length": data.max_length, "packing": False})
    stats.update({"rows": total, "parsed": total, "unparsable": 0, "unparsable_examples": []})
    stats.update({"lines": total, "bad_lines": 0, "bad_line_examples": [], "dropped": {}, "repaired": {}})
    for name, split in (("train", rows[held:]), ("eval", rows[:held])):
        n = len(split)
        packed = PackStats(documents=n, rows=n, tokens=n * data.max_length, supervised_tokens=n * (data.max_length - 1))
        counts = {"no_assistant": 0, "render_failures": 0, "render_failure_examples": []}
        stats[name] = _split_stats(n, counts, packed, data.max_length)
        _dataset(split, f"{fingerprint}-{name}").save_to_disk(str(tmp / name))
    (tmp / "eval_conversations.jsonl").write_text("")  # nothing to generate from: random tokens
    return stats


# What this process is writing in a cache directory now: the build's temporary directory and the note beside its
# lock. SIGTERM's watch ends the process with os._exit, past the build's own clean-up (train/run.py), and
# removes these first (abandon_builds): a stopped preparation left both until the next one of that data.
_IN_PROGRESS: list[Path] = []


def abandon_builds() -> None:
    """Remove what this process's unfinished preparation wrote (a SIGTERM's last act before the exit). The
    temporary directory is renamed away first: where the main thread has just renamed it into place (a whole
    cache entry), the rename fails and nothing of the entry is touched; where not, its own rename fails next."""
    for path in list(_IN_PROGRESS):
        if not path.is_dir():  # the lock's note (or a directory the build has renamed into place: no file there)
            path.unlink(missing_ok=True)
            continue
        doomed = path.with_name(path.name + ".abandoned")
        try:
            os.rename(path, doomed)
        except OSError:
            continue  # renamed into place by the build, or gone
        shutil.rmtree(doomed, ignore_errors=True)


def _build(cfg: FinetuneConfig, tokenizer: Any, fingerprint: str, target: Path) -> None:
    tmp = target.parent / f"{fingerprint}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    _IN_PROGRESS.append(tmp)
    try:
        if cfg.data.source == SYNTHETIC:
            stats = _build_synthetic(cfg, tokenizer, fingerprint, tmp)
        else:
            stats = _build_conversations(cfg, tokenizer, fingerprint, tmp)
        _finish(tmp, target, fingerprint, stats)
    except BaseException as exc:
        # Refused data, a full disk, Ctrl-C: no half-written directory stays behind for the next run to trip on.
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception) and is_no_space(exc):  # datasets' writer names no path: name the cache
            raise NoSpaceError(
                f"{no_space_message(target.parent, exc, 'the prepared data')}: nothing of it was kept. Free space "
                "there or set data.cache_dir to a larger filesystem"
            ) from exc
        raise
    finally:
        _IN_PROGRESS.remove(tmp)


def _build_conversations(cfg: FinetuneConfig, tokenizer: Any, fingerprint: str, tmp: Path) -> dict[str, Any]:
    data = cfg.data
    conversations, report = load_conversations(data)
    check_usable(data, report, conversations)
    train_convs, eval_convs = split_conversations(conversations, data.eval_fraction, data.seed)
    check_split("train", train_convs, conversations, data.eval_fraction)
    check_split("eval", eval_convs, conversations, data.eval_fraction)
    stats: dict[str, Any] = {
        "fingerprint": fingerprint,
        "data_method_version": DATA_METHOD_VERSION,
        "source": data.source,
        "format": data.format,
        "template": data.template,
        "tokenizer": cfg.model.name,
        "max_length": data.max_length,
        "packing": data.packing,
        **report.as_dict(),
        "unparsable_examples": [list(e) for e in report.examples],
    }
    for name, convs in (("train", train_convs), ("eval", eval_convs)):
        docs, counts = tokenize_conversations(tokenizer, convs)
        rows, pack_stats = pack(docs, data.max_length, data.packing)
        if not rows:
            check_rows(name, len(convs), docs, counts, data)
        stats[name] = _split_stats(len(convs), counts, pack_stats, data.max_length)
        _dataset(rows, f"{fingerprint}-{name}").save_to_disk(str(tmp / name))
    with open(tmp / "eval_conversations.jsonl", "w", encoding="utf-8") as f:
        for conv in eval_convs:
            f.write(json.dumps(conv.to_json(), ensure_ascii=False) + "\n")
    return stats


def _finish(tmp: Path, target: Path, fingerprint: str, stats: dict[str, Any]) -> None:
    """Stats, the size of every file, and the READY marker last, then the rename that makes the cache entry
    appear whole."""
    (tmp / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    sizes = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
    (tmp / FILES).write_text(json.dumps(sizes, indent=1) + "\n", encoding="utf-8")
    (tmp / READY).write_text(fingerprint + "\n")
    if target.exists():  # an incomplete directory left by an older layout or a manual copy
        shutil.rmtree(target)
    os.replace(tmp, target)


def _damaged(path: Path, what: str) -> DataError:
    return DataError(
        f"data.cache_dir: the prepared data in {path} is damaged ({what}): remove that directory and run again, "
        "which prepares it afresh"
    )


def _check_files(path: Path) -> None:
    """Every file the preparation wrote, at the size it had: a file cut short at a record batch's end loads as
    fewer rows without a word (a run trained on 5,000 of 16,260)."""
    try:
        sizes = json.loads((path / FILES).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return  # prepared before sizes were kept: the row counts below still hold it to its stats
    except (OSError, ValueError) as exc:
        raise _damaged(path, f"{FILES}: {exc}") from None
    for name, size in sizes.items():
        try:
            found = (path / name).stat().st_size
        except OSError as exc:
            raise _damaged(path, f"{name}: {exc.strerror or exc}") from None
        if found != size:
            raise _damaged(path, f"{name} has {found:,} bytes, {size:,} when it was prepared")


def _load(path: Path, fingerprint: str, built: bool) -> Prepared:
    _check_files(path)
    try:
        stats = json.loads((path / "stats.json").read_text(encoding="utf-8"))
        train, evals = load_from_disk(str(path / "train")), load_from_disk(str(path / "eval"))
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise _damaged(path, f"{type(exc).__name__}: {exc}") from None
    for name, split in (("train", train), ("eval", evals)):
        rows = (stats.get(name) or {}).get("rows")
        if rows is not None and len(split) != rows:
            raise _damaged(path, f"{name}/ holds {len(split):,} rows, stats.json says {rows:,} were prepared")
    return Prepared(train=train, eval=evals, stats=stats, fingerprint=fingerprint, path=path, built=built)


# A wait for another process's preparation longer than this is said, naming that process.
LOCK_NOTICE_S = 10.0


def _holder(path: Path) -> str:
    """Who holds a preparation lock, from the note it wrote beside it ("pid 123 on node-a since 10:02:11 UTC,
    preparing SOURCE"), or why that is unknown."""
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
        since = time.strftime("%H:%M:%S UTC", time.gmtime(note["since"]))
        return f"pid {note['pid']} on {note['host']} since {since}, preparing {note['source']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that left no note (an older gpucert, or one just starting)"


class _PreparationLock:
    """The lock of one fingerprint's preparation in cache_dir, held by one process (ranks, nodes and
    `finetune prepare` alike), with a note of who holds it. Waiting is said after LOCK_NOTICE_S and ends with a
    DataError naming the holder after data.lock_timeout_s: a preparation hung on another node never ends."""

    def __init__(self, root: Path, fingerprint: str, data: DataConfig) -> None:
        self.path = root / f"{fingerprint}.lock"
        self.note = root / f"{fingerprint}.holder.json"
        self.lock = FileLock(str(self.path))
        self.data = data

    def __enter__(self) -> _PreparationLock:
        limit = self.data.lock_timeout_s
        try:
            self.lock.acquire(timeout=min(LOCK_NOTICE_S, limit))
        except Timeout:
            log.warning("waiting up to %g s (data.lock_timeout_s) for %s: %s", limit, self.path, _holder(self.note))
            try:
                self.lock.acquire(timeout=max(limit - LOCK_NOTICE_S, 0.0))
            except Timeout:
                raise DataError(
                    f"data.cache_dir: {self.path} is still held after {limit:g} s (data.lock_timeout_s) by "
                    f"{_holder(self.note)}. If that process is hung, stop it and run again (its lock goes with "
                    "it); if its preparation just takes longer, raise data.lock_timeout_s"
                ) from None
        note = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "source": self.data.source}
        self.note.write_text(json.dumps(note) + "\n", encoding="utf-8")
        _IN_PROGRESS.append(self.note)
        return self

    def __exit__(self, *_: object) -> None:
        self.note.unlink(missing_ok=True)
        _IN_PROGRESS.remove(self.note)
        self.lock.release()


def prepare_dataset(cfg: FinetuneConfig, tokenizer: Any) -> Prepared:
    """The prepared train/eval rows of cfg.data, built once per fingerprint and shared by every process."""
    fingerprint = data_fingerprint(cfg, tokenizer)
    root = Path(cfg.data.cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / fingerprint
    if (target / READY).exists():
        return _load(target, fingerprint, built=False)
    with _PreparationLock(root, fingerprint, cfg.data):
        if (target / READY).exists():
            return _load(target, fingerprint, built=False)
        # Temporary directories of a preparation that died (or was abandoned); we hold the lock, so none is in use.
        for stale in root.glob(f"{fingerprint}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        log.info("preparing data %s into %s", cfg.data.source, target)
        # Progress bars of dataset conversion and saving would interleave across ranks; the stats tell the story.
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()
        try:
            _build(cfg, tokenizer, fingerprint, target)
        finally:
            if bars:
                datasets.enable_progress_bars()
    return _load(target, fingerprint, built=True)


def load_eval_conversations(path: Path) -> list[Conversation]:
    """The held-out conversations of a prepared dataset (Prepared.path), for generation-based evaluation; a file
    cut short is refused naming its line, or its count against stats.json."""
    file = Path(path) / "eval_conversations.jsonl"
    conversations = []
    try:
        # "\n" only: the file is written with ensure_ascii=False, and splitlines() would also split at a U+2028
        # or U+0085 inside a conversation's text (scraped text has them).
        lines = file.read_text(encoding="utf-8").split("\n")
    except (OSError, ValueError) as exc:
        raise _damaged(Path(path), f"{file.name}: {getattr(exc, 'strerror', None) or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            conversations.append(Conversation.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError) as exc:
            raise _damaged(Path(path), f"{file.name}:{number}: {exc}") from None
    expected = _eval_conversations(Path(path))
    if expected is not None and len(conversations) != expected:
        raise _damaged(Path(path), f"{file.name} holds {len(conversations)} conversations, {expected} were prepared")
    return conversations


def _eval_conversations(path: Path) -> int | None:
    """How many held-out conversations stats.json says were written; None where it cannot say (synthetic rows
    have none to write, though their eval split has rows)."""
    try:
        stats = json.loads((path / "stats.json").read_text(encoding="utf-8"))
        if stats.get("source") == SYNTHETIC:
            return None
        return int(stats["eval"]["conversations"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def report_lines(stats: Mapping[str, Any], examples: int = REFUSAL_EXAMPLES) -> list[str]:
    """The preparation report as text (`gpucert finetune prepare`): rows read and parsed, lines skipped, each
    dropped and repaired case with its count and first examples, then the splits."""
    lines = [f"rows {stats['rows']}, parsed {stats['parsed']}, unparsable {stats['unparsable']}"]
    if stats.get("bad_lines"):
        lines.append(f"{stats['bad_lines']} of {stats['lines']} lines skipped (not JSON objects):")
        lines += [f"  {example}" for example in stats["bad_line_examples"][:examples]]
    for kind in ("dropped", "repaired"):
        for case, tally in sorted(stats.get(kind, {}).items(), key=lambda item: (-item[1]["count"], item[0])):
            lines.append(f"{kind} {case}: {tally['count']}")
            lines += [f"  {_example_text(example)}" for example in tally["examples"][:examples]]
    for split in ("train", "eval"):
        s = stats[split]
        lines.append(
            f"{split}: {s['conversations']} conversations -> {s['rows']} packed rows, {s['tokens']} tokens, "
            f"{s['supervised_share']:.1%} supervised, {s['truncated']} truncated, {s['dropped']} dropped"
        )
    return lines
