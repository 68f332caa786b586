"""Where reports live: one directory per run, `runs/<UTC timestamp>-<host>/report.json` (+ report.md).

A run claims its directory before it starts (`claim_run_dir`): a new default directory is created with
mkdir's exclusive create, so two runs started in the same second get `...-<host>` and `...-<host>-2`; and the
directory is locked (runtime/dirlock.py, the lock fine-tuning takes too) while the run writes into it, so a
second run pointed at the same `--output` is refused and told who holds it; a lock file left by a killed run
blocks nobody.

An `--output` that holds an earlier run's report is re-run in place only by the same verb (the HealthCheckProgram's
`health --drain --output /var/lib/gpucert/last` every 300 s), and that run first removes what the earlier one
wrote (`RUN_ARTEFACTS`, its ranks' logs), so the directory never mixes two runs; another verb is refused before
any work (check_reuse), as HF Trainer refuses a non-empty output_dir: gpucert will not guess whose files to drop.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

from gpucert.config.loader import ConfigError
from gpucert.report.markdown import render_markdown
from gpucert.report.schema import Report
from gpucert.runtime.dirlock import lock_dir, unlock_dir


def default_run_dir(runs_dir: Path, host: str, started: datetime) -> Path:
    return runs_dir / f"{started.strftime('%Y%m%dT%H%M%SZ')}-{host}"


@dataclass
class RunDir:
    """A run directory this process holds: locked until release(), and then removed, with any parents this run
    created, where nothing was written into it (a run refused or failed before writing leaves no empty
    directories behind)."""

    path: Path
    created: list[Path]  # the directories this run made, the run directory first
    fd: int | None  # the open, locked lock file; None where the filesystem has no locks

    def release(self) -> None:
        """Idempotent: the run's end and an abort handler may both call it."""
        fd, self.fd = self.fd, None
        unlock_dir(self.path, fd)
        if self.created and not (self.path / "report.json").exists():
            _drop_empty_logs(self.path / "logs")
        for directory in self.created:
            try:
                directory.rmdir()  # only when empty
            except OSError:
                break
        self.created = []

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


# What a judged run writes in its directory, and a later run of the same verb there removes first. The ranks'
# logs are runtime/launcher.py's names. Anything else (a launch's job.sbatch and node logs, the user's files) stays.
RUN_ARTEFACTS = ("report.json", "report.md", "report.html")
RANK_LOGS = ("rank-*.log", "error-rank-*.json")


def _drop_empty_logs(logs: Path) -> None:
    """The ranks' logs that stayed empty in a run that wrote no report (stopped in its start-up): they say
    nothing, and kept the directory of a run that left nothing else."""
    for pattern in RANK_LOGS:
        for log in logs.glob(pattern):
            with contextlib.suppress(OSError):
                if log.stat().st_size == 0:
                    log.unlink()
    with contextlib.suppress(OSError):
        logs.rmdir()  # only when empty


# earlier_verb's answer for a report.json gpucert cannot read.
UNREADABLE = "unknown (a report.json gpucert cannot read)"


def earlier_verb(directory: Path) -> str | None:
    """The verb of the report an earlier run left in `directory` (`accept`, `bench matmul`); None where there is
    none. A report.json gpucert cannot read is said as such, so it is refused rather than deleted."""
    path = directory / "report.json"
    if not path.is_file():
        return None
    try:
        return str(json.loads(path.read_text())["meta"]["verb"])
    except (OSError, ValueError, KeyError, TypeError):
        return UNREADABLE


def check_reuse(output: Path, verb: str) -> None:
    """Refuse an --output holding another verb's report (exit 3), before any work: the run would leave that
    report's other files (report.html, logs/) beside its own."""
    found = earlier_verb(output)
    if found is None or found == verb:
        return
    raise ConfigError(
        f"--output {output} holds the report of an earlier `gpucert {found}` run; this `gpucert {verb}` would "
        f"mix its files with that run's: choose another --output, or remove {output} first "
        "(the same verb re-run there replaces its own report and logs)"
    )


# Where `health --drain --output DIR` keeps its first reading's report (fleet/recheck.py): an earlier run's too.
FIRST_READING = "first-reading"


def clear_earlier_run(directory: Path) -> list[Path]:
    """Remove what an earlier run wrote in `directory` (its report files, its ranks' logs, a first reading it kept);
    the paths removed."""
    kept = directory / FIRST_READING
    removed = [directory / name for name in RUN_ARTEFACTS if (directory / name).is_file()]
    removed += [kept / name for name in RUN_ARTEFACTS if (kept / name).is_file()]
    removed += [p for pattern in RANK_LOGS for p in (directory / "logs").glob(pattern) if p.is_file()]
    for path in removed:
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        kept.rmdir()  # only when empty: anything else there is not gpucert's
    return removed


def claim_run_dir(output: Path | None, runs_dir: Path, host: str, started: datetime, verb: str | None = None) -> RunDir:
    """The run's directory, created if need be and locked: `output` as named, or a new one under runs_dir. With
    `verb`, an --output holding another verb's report is refused and one of the same verb's is cleared of it
    (check_reuse, clear_earlier_run), under the lock, so no running run loses its files.

    A ConfigError (exit 3) names the directory and the run holding it when another run has it locked."""
    if output is not None:
        missing = _missing_dirs(output)
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--output {output}: cannot create it: {exc.strerror or exc}") from None
        try:
            run = RunDir(output, missing, lock_dir(output, "--output"))
        except ConfigError:
            RunDir(output, missing, None).release()  # refused: leave no directory made for it
            raise
        if verb is not None:
            try:
                check_reuse(output, verb)
                clear_earlier_run(output)
            except BaseException:
                run.release()
                raise
        return run
    base = default_run_dir(runs_dir, host, started)
    for n in itertools.count(1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        missing = _missing_dirs(path)
        try:
            path.mkdir(parents=True)  # exclusive: of two runs started in the same second, one gets -2
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(f"runs_dir {runs_dir}: cannot create {path}: {exc.strerror or exc}") from None
        return RunDir(path, missing, lock_dir(path, "runs_dir"))
    raise AssertionError("unreachable")


def _missing_dirs(path: Path) -> list[Path]:
    """path and those of its parents that do not exist yet, deepest first."""
    missing = []
    for directory in (path, *path.parents):
        if directory.exists():
            break
        missing.append(directory)
    return missing


# write_problem's answer when the nearest existing path is a file.
NOT_A_DIRECTORY = "not a directory"


def write_problem(target: Path) -> tuple[Path, str | None]:
    """(the directory a run at `target` would write in: target, or its nearest existing parent that would hold
    it; why it cannot be written there, or None). Creates nothing. Probed with a real file: permission bits do
    not tell a read-only mount, and root writes through them."""
    nearest = next(p for p in (target, *target.parents) if p.exists() or p == p.parent)
    if not nearest.is_dir():
        return nearest, NOT_A_DIRECTORY
    try:
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError as exc:
        return nearest, str(exc.strerror or exc)
    return nearest, None


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """Which file `path` is now (inode, mtime, size), or None where there is none: compared before and after a job
    to tell what it wrote from what an earlier run left in a re-used --output. Compared, not timed: a shared
    filesystem's server clock need not agree with this host's (write_atomic replaces a file: a new inode)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def write_atomic(path: Path, text: str | Iterable[str]) -> None:
    """`text`, or its pieces as they come, under `path`, whole or not at all: a report half-written by a killed run
    or a full disk must never be read as a whole one, and no temporary file is left behind."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            for chunk in [text] if isinstance(text, str) else text:
                fh.write(chunk)
        # mkstemp makes 0600 files; reports in a shared runs/ directory must be readable as the umask allows.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            # A write's ENOSPC or EIO names no file: say which one could not be written.
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it: write_atomic runs on the watchdog's and
    SIGTERM's threads too, and os.umask can only read by setting, so a file another thread made meanwhile would get
    the temporary mask."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # the strictest, if briefly in force
    os.umask(mask)
    return mask


def write_report(report: Report, directory: Path, html: bool = False) -> Path:
    """report.json and report.md, and report.html when asked (plots take a few seconds) and matplotlib is
    installed (gpucert[html]); `gpucert report RUN --html` draws it later where it is."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "report.json"
    write_atomic(path, json.dumps(report.to_dict(), indent=1) + "\n")
    write_atomic(directory / "report.md", render_markdown(report))
    if html and importlib.util.find_spec("matplotlib") is not None:
        write_html(report, directory)
    return path


def write_html(report: Report, directory: Path, name: str = "report.html") -> Path:
    from gpucert.report.html import render_html  # matplotlib loads only when a page is drawn

    path = directory / name
    write_atomic(path, render_html(report))
    return path


def check_writable(out: Path, what: str) -> None:
    """Refuse, creating nothing, an output directory a run could not write: `what` is the option that named it
    (--output, output_dir)."""
    nearest, problem = write_problem(out.absolute())
    if problem == NOT_A_DIRECTORY:
        raise ConfigError(f"{what} {out}: {nearest} is not a directory")
    if problem is not None:
        raise ConfigError(f"{what} {out}: cannot write in {nearest}: {problem}")


def load_report(path: Path) -> Report:
    """A report from its JSON file or its run directory; errors name the file (and, for a fine-tuning run that has
    not finished, how to finish it)."""
    if not path.exists():
        raise ValueError(f"{path}: no such run directory or report.json")
    if path.is_dir():
        if not (path / "report.json").exists() and (path / "checkpoints").is_dir():
            raise ValueError(
                f"{path}: a fine-tuning run that has not finished (no report.json yet; checkpoints in "
                f"{path / 'checkpoints'}): finish it with gpucert finetune --config {path / 'config.yaml'} "
                f"--output {path} --resume auto"
            )
        if not (path / "report.json").exists():
            raise ValueError(
                f"{path}: no report.json: not a gpucert run directory, or a run that stopped before writing its "
                "report (its logs/ and stderr say why)"
            )
        path = path / "report.json"
    try:
        text = path.read_text()
        if not text.strip():
            raise ValueError("the file is empty (a run stopped while writing it, or a copy that did not finish?)")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"not JSON: {exc.msg.removesuffix(' at')} at line {exc.lineno} column {exc.colno} (cut short, or "
                "not a report.json?)"
            ) from None
        return Report.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable gpucert report: {exc}") from exc
