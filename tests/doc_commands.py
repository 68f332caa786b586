"""The shell commands the docs show, collected and checked against gpucert's own parsers.

A command is one line of a fenced block (no language, or bash/sh/shell/console), lines ending in a backslash
joined, a trailing `# comment` kept apart (it may say `exits N`), `$ ` prompts stripped. A block with no language
counts as shell only where its first command starts with a program (KNOWN_PROGRAMS) and it draws no box
characters: the docs also fence formulas, diagrams and sample output without a language.

check_command() parses every gpucert part of a command (after env, exec, srun, torchrun -m, python -m, docker run
of the gpucert image, `&&` chains) with gpucert's real parsers, checks `--set` keys against the config
dataclasses (gpucert.config.loader, as a run does), `--config` and `--profile` names, and what is cheap to check
of the rest: torchrun's own options, `python -m` modules, `make` targets, repository paths. Placeholders (RUN,
<id>, DIR, [optional parts], ...) are parsed as text; where an option wants a number, as 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
# The first word of a command in a block with no language: anything else (a formula, a log line) is not one.
KNOWN_PROGRAMS = {
    *("gpucert", "python", "python3", "pip", "pip3", "make", "pytest", "ruff", "mypy", "uv"),
    *("torchrun", "srun", "sbatch", "salloc", "scontrol", "sinfo", "squeue", "scancel"),
    *("kubectl", "helm", "docker", "podman", "promtool", "nvidia-smi", "ssh", "curl", "git"),
    *("mkdir", "cp", "mv", "rm", "ls", "cat", "grep", "cd", "export", "source", "echo", "tar", "bash", "sh"),
}
# Words in front of the program they run.
PREFIXES = {"exec", "sudo", "time", "command"}
# Programs that run another program given later on their command line.
WRAPPERS = {"srun", "salloc", "timeout", "nice", "nohup", "xargs"}
BOX_CHARACTERS = set("─│┌┐└┘├┤┬┴┼►◄▼▲═║")
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"}
# Pages that record what was run (measurements): their commands must still parse, as they were run.
RECORDS = ("docs/results/",)
REPO_DIRS = ("configs/", "deploy/", "docs/", "src/", "tests/", "tools/")


@dataclasses.dataclass(frozen=True)
class DocCommand:
    path: str  # relative to the repository
    line: int  # where the command starts
    text: str  # the command as one line: continuations joined, comment and prompt removed
    comment: str = ""  # its trailing comment, what the doc says of it ("exits 2: a FAIL")

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


@dataclasses.dataclass
class Checked:
    """What check_command did to one command: checks passed by name, problems as messages."""

    checks: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)


def doc_paths(root: Path = REPO) -> list[Path]:
    """README.md and every page under docs/ (the results pages too: their commands are how to measure again)."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


# ---------------------------------------------------------------- collect


def fenced_blocks(text: str) -> Iterator[tuple[str, list[tuple[int, str]]]]:
    """(language, [(line number, line)]) of every fenced block; the fence's indent is taken off its lines."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)", lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, language = len(opening.group(1)), opening.group(2), opening.group(3).lower()
        body = []
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[i]):
            line = lines[i]
            body.append((i + 1, line[indent:] if line[:indent].strip() == "" else line.lstrip()))
            i += 1
        i += 1
        yield language, body


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of one line: a `#` outside quotes, at the start or after a space, starts the comment."""
    quote, escaped = "", False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def commands_of_block(language: str, body: list[tuple[int, str]], path: str) -> list[DocCommand]:
    if language not in SHELL_LANGUAGES:
        return []
    if language == "" and any(BOX_CHARACTERS & set(line) for _, line in body):
        return []  # a diagram
    prompted = language == "console" or any(line.startswith("$ ") for _, line in body)
    found: list[DocCommand] = []
    start, parts, comments = 0, list[str](), list[str]()
    for number, raw in body:
        line = raw
        if not parts:
            if prompted:
                if not line.startswith("$ "):
                    continue  # output under a prompt
                line = line[2:]
            start = number
        code, comment = split_comment(line)
        if comment:
            comments.append(comment)
        if code.endswith("\\"):
            parts.append(code[:-1].strip())
            continue
        parts.append(code.strip())
        text = " ".join(p for p in parts if p)
        if text:
            found.append(DocCommand(path, start, text, " ".join(comments)))
        parts, comments = [], []  # a comment line says nothing of the command after it
    if parts and " ".join(parts).strip():  # a block ending on a backslash
        found.append(DocCommand(path, start, " ".join(p for p in parts if p), " ".join(comments)))
    if language == "" and (not found or program_of(words(found[0].text)) not in KNOWN_PROGRAMS):
        return []  # output, a formula, a config file
    return found


def collect_commands(path: Path, root: Path = REPO) -> list[DocCommand]:
    name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    commands = []
    for language, body in fenced_blocks(path.read_text(encoding="utf-8")):
        commands += commands_of_block(language, body, name)
    return commands


def collect_all(root: Path = REPO) -> list[DocCommand]:
    return [command for path in doc_paths(root) for command in collect_commands(path, root)]


# ---------------------------------------------------------------- words


# `runs/<id>/adapter`: a placeholder in the docs, where a shell would read two redirections.
ANGLED = re.compile(r"<([A-Za-z][\w.-]*)>")


# `--master-addr=$(scontrol show hostnames ... | head -n1)`: one word, whatever its inside holds.
SUBSTITUTION = re.compile(r"\$\([^()]*\)")


def words(text: str) -> list[str]:
    """The command's words as the shell splits them (quotes removed), operators (&&, |, >) as words."""
    text = re.sub(r"(?<=\s)\d+(?=>)", "", text)  # `2>&1`: the descriptor is no argument
    substitutions = SUBSTITUTION.findall(text)
    for i, found in enumerate(substitutions):
        text = text.replace(found, f"\u27e6{i}\u27e7", 1)
    lexer = shlex.shlex(ANGLED.sub("\u27e8\\1\u27e9", text), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote
        tokens = text.split()
    restored = []
    for token in tokens:
        token = token.replace("\u27e8", "<").replace("\u27e9", ">")
        restored.append(re.sub("\u27e6(\\d+)\u27e7", lambda m: substitutions[int(m.group(1))], token))
    return restored


def segments(tokens: list[str]) -> list[list[str]]:
    """The simple commands of a line (split at &&, ||, ;, |), redirections and their targets removed."""
    found: list[list[str]] = [[]]
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token in OPERATORS:
            found.append([])
        elif token[:1] in ("<", ">") or token == "&>":
            skip = True  # `> file`, `2>&1`: the target is no argument
        else:
            found[-1].append(token)
    return [segment for segment in found if segment]


def unwrap(segment: list[str]) -> list[str]:
    """The segment from its program on: VAR=value assignments, env (and its assignments), exec, sudo left off."""
    i = 0
    while i < len(segment):
        word = segment[i]
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word) or word in PREFIXES:
            i += 1
        elif word == "env":
            i += 1
            while i < len(segment) and (segment[i].startswith("-") or "=" in segment[i]):
                i += 1
        else:
            break
    return segment[i:]


def program_of(tokens: list[str]) -> str:
    found = segments(tokens)
    rest = unwrap(found[0]) if found else []
    return Path(rest[0]).name if rest else ""


def is_placeholder(word: str) -> bool:
    """RUN, RUNS_DIR, <id>, runs/<id>/adapter, ..., [--html]: what a reader fills in (a typed option gets 1)."""
    word = word.strip("[]")
    return (
        bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", word))
        or bool(re.search(r"<[^>]*>", word))
        or "..." in word
        or word.startswith("$")
    )


def placeholders(text: str) -> list[str]:
    """The words of a command a reader fills in before running it; `[...]` marks an optional part."""
    found = [w for w in words(text) if is_placeholder(w) or w.startswith("[") or (w.endswith("]") and "[" not in w)]
    # $node, ${RUN}, $(hostname): the shell's values on the reader's machine.
    shell = re.findall(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\$\([^)]*\)", text)
    return list(dict.fromkeys(found + shell))


def without_brackets(args: list[str]) -> list[str]:
    """`[--config ...]` as `--config ...`: an optional part of a synopsis, checked as if given."""
    out = []
    for arg in args:
        if arg.startswith("["):
            arg = arg[1:]
        if arg.endswith("]") and "[" not in arg:
            arg = arg[:-1]
        if arg:
            out.append(arg)
    return out


# ---------------------------------------------------------------- check


def check_command(command: DocCommand) -> Checked:
    """Every part of the command that can be checked without running it; problems name the doc's file:line."""
    result = Checked()
    for segment in segments(words(command.text)):
        _check_segment(unwrap(segment), result, record=command.path.startswith(RECORDS))
    _check_repo_paths(words(command.text), result)
    result.problems = [f"{command.id}: `{command.text}`: {problem}" for problem in result.problems]
    return result


def _check_segment(segment: list[str], result: Checked, record: bool = False) -> None:
    if not segment:
        return
    program, args = Path(segment[0]).name, segment[1:]
    if program == "gpucert":
        result.checks.append("gpucert parser")
        result.problems += check_gpucert(without_brackets(args))
    elif program.startswith("python"):
        _check_python(args, result)
    elif program == "torchrun":
        _check_torchrun(args, result, record)
    elif program in WRAPPERS:
        # srun's own options are Slurm's to judge (tests/cluster); what it starts is ours.
        inner = next(
            (i for i, a in enumerate(args) if Path(a).name in ("gpucert", "python", "python3", "torchrun")), None
        )
        if inner is not None:
            _check_segment(args[inner:], result, record)
    elif program == "make":
        targets = [a for a in args if not a.startswith("-") and "=" not in a]
        makefile = (REPO / "Makefile").read_text()
        for target in targets:
            if not re.search(rf"^{re.escape(target)}:", makefile, re.MULTILINE):
                result.problems.append(f"make {target}: no such target in the Makefile")
        result.checks.append("make target")
    elif program == "docker" and args[:1] == ["run"]:
        _check_docker_run(args[1:], result)


def _check_python(args: list[str], result: Checked) -> None:
    import importlib.util

    if "-m" not in args or args.index("-m") + 1 >= len(args):
        return
    at = args.index("-m")
    module, rest = args[at + 1], args[at + 2 :]
    if module == "gpucert":
        result.checks.append("gpucert parser")
        result.problems += check_gpucert(without_brackets(rest))
        return
    result.checks.append("python -m module")
    if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
        result.problems.append(f"python -m {module}: no such module here")


@functools.cache
def _torchrun_parser() -> Any:
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "torchrun"
    return parser


def _check_torchrun(args: list[str], result: Checked, record: bool = False) -> None:
    """torchrun's options by torch's own parser; the gpucert it starts (-m gpucert, --no-python gpucert) by ours.
    A torchrun across nodes bounds its rendezvous, unless the page is a record of what ran (docs/results/)."""
    result.checks.append("torchrun parser")
    parsed, message = parse_with(_torchrun_parser(), without_brackets(args), "torchrun")
    if message:
        result.problems.append(message)
        return
    nodes = max(int(n) for n in re.findall(r"\d+", parsed.nnodes) or ["2"])
    if not record and nodes > 1 and not re.search(r"(^|,)(join_)?timeout=\d", parsed.rdzv_conf or ""):
        # torchrun's rendezvous waits 600-900 s for a node that never comes, then a traceback naming nobody.
        result.problems.append(
            f"torchrun --nnodes {parsed.nnodes} with no bound on its rendezvous: add --rdzv-conf=timeout=120 "
            "(static, with --master-addr) or --rdzv-conf=join_timeout=120 (c10d)"
        )
    script = parsed.training_script
    if (parsed.module and script == "gpucert") or (parsed.no_python and Path(script).name == "gpucert"):
        result.checks.append("gpucert parser")
        result.problems += check_gpucert(without_brackets(parsed.training_script_args))
    elif parsed.module:
        _check_python(["-m", script], result)


def _check_docker_run(args: list[str], result: Checked) -> None:
    """`docker run ... IMAGE VERB ...` of the gpucert image: its entrypoint is gpucert (deploy/Dockerfile)."""
    image = next((i for i, a in enumerate(args) if not a.startswith("-") and "gpucert" in a.split("/")[-1]), None)
    if image is None:
        return
    dockerfile = (REPO / "deploy/Dockerfile").read_text()
    if not re.search(r'^ENTRYPOINT \["gpucert"\]', dockerfile, re.MULTILINE):
        result.problems.append("docker run of the gpucert image: deploy/Dockerfile's ENTRYPOINT is not gpucert")
        return
    if args[image + 1 :]:
        result.checks.append("gpucert parser")
        result.problems += check_gpucert(without_brackets(args[image + 1 :]))


def _check_repo_paths(tokens: list[str], result: Checked) -> None:
    """configs/..., tests/fixtures/..., deploy/...: a path into the repository exists (globs match something)."""
    outputs = {tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t in ("-o", "--output")}
    for token in tokens:
        value = token.split("=", 1)[1] if token.startswith("--") and "=" in token else token
        value = value.strip("[]")
        if not value.startswith(REPO_DIRS) or value in outputs or is_placeholder(value):
            continue
        result.checks.append("path exists")
        if not any(REPO.glob(value)) and not (REPO / value).exists():
            result.problems.append(f"{value}: no such file or directory in the repository")


# ---------------------------------------------------------------- gpucert


def parse_with(parser: Any, args: list[str], name: str) -> tuple[Any, str]:
    """(namespace, "") or (None, argparse's message). A placeholder an option cannot take (`--threshold PCT`,
    `--node-rank R`) is read as 1, a placeholder choice as the first choice: the doc's option still exists."""
    args = list(args)
    for _ in range(len(args) + 1):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                namespace = parser.parse_args(args) if name != "launch" else parser.parse_known_args(args)
            return namespace, ""
        except SystemExit as stop:
            if stop.code in (0, None):  # --help, --version
                return None, ""
        message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "argparse refused it"
        node_path = _node_path(message, args)
        if node_path is not None:
            # `--metrics-file /var/lib/node_exporter/textfile/x.prom` checks its directory at parse time: a path of
            # the node the doc speaks of, here one that exists.
            args[node_path] = str(Path(tempfile.gettempdir()) / Path(args[node_path]).name)
            continue
        elided = re.search(r"unrecognized arguments: (.*)$", message)
        if elided and all(word == "..." for word in elided.group(1).split()):
            return None, ""  # `gpucert cluster localize ... --set ...`: the doc left words out
        bad = re.search(r"invalid (?:\w+ value|choice): '([^']*)'", message)
        at = [i for i, a in enumerate(args) if bad and (a == bad.group(1) or a.endswith(f"={bad.group(1)}"))]
        if not (bad and is_placeholder(bad.group(1)) and at):
            return None, message
        choice = re.search(r"choose from '?([^',)]+)", message)
        value = choice.group(1) if choice else "1"
        args[at[0]] = value if args[at[0]] == bad.group(1) else f"{args[at[0]].split('=', 1)[0]}={value}"
    return None, "argparse refused it"


def _node_path(message: str, args: list[str]) -> int | None:
    """Where in args the absolute path is that an option's type refused because this machine lacks it."""
    refused = re.search(r"argument (--[\w-]+)[^:]*: (/\S*) (?:does not exist|is not writable)", message)
    if not refused:
        return None
    option = refused.group(1)
    for i, arg in enumerate(args[:-1]):
        if arg == option and args[i + 1].startswith("/") and args[i + 1] != tempfile.gettempdir():
            return i + 1
    return None


@functools.cache
def _gpucert_parser() -> Any:
    from gpucert.cli import build_parser

    return build_parser()


def check_gpucert(argv: list[str]) -> list[str]:
    """Problems of one gpucert command line: what argparse refuses, an unknown `--set` key or a value of the wrong
    type, a `--config` or `--profile` that names nothing, an unknown benchmark in `--skip`."""
    if argv[:1] == ["launch"]:
        return _check_launch(argv[1:])
    args, message = parse_with(_gpucert_parser(), argv, "gpucert")
    if message:
        return [message]
    if args is None:
        return []
    problems: list[str] = []
    finetuning = args.verb in ("finetune", "evaluate")
    config = getattr(args, "config", None)
    config_path = _config_path(str(config) if config is not None else None, finetuning, problems)
    for item in getattr(args, "overrides", []):
        problems += check_override(item, finetuning, config_path)
    profile = getattr(args, "profile", None)
    if profile and not is_placeholder(profile):
        from gpucert.config.profiles import available_profiles

        if profile not in available_profiles() and not (REPO / profile).is_file() and not profile.startswith("/"):
            problems.append(
                f"--profile {profile}: no built-in profile of that name ({', '.join(available_profiles())})"
            )
    skip = getattr(args, "skip", "")
    if skip:
        from gpucert.bench.catalog import BENCHMARKS

        unknown = [s for s in skip.split(",") if s.strip() and s.strip() not in BENCHMARKS]
        if unknown:
            problems.append(f"--skip {skip}: unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    return problems


def _config_path(given: str | None, finetuning: bool, problems: list[str]) -> Path | None:
    """The file `--config` names (a repository path, or a recipe name for finetune/evaluate); None where it is
    absent or a placeholder (the defaults are checked instead)."""
    from gpucert.finetune.config import recipe_dir, recipe_names

    if given is None or is_placeholder(given) or given.startswith("/"):
        return recipe_dir() / "tiny.yaml" if finetuning else None
    if (REPO / given).is_file():
        return REPO / given
    stem = given.removesuffix(".yaml").removesuffix(".yml")
    if finetuning and "/" not in stem and stem in recipe_names():
        return recipe_dir() / f"{stem}.yaml"
    what = f"no such file and no recipe of that name ({', '.join(recipe_names())})" if finetuning else "no such file"
    problems.append(f"--config {given}: {what}")
    return None


def check_override(item: str, finetuning: bool, config_path: Path | None) -> list[str]:
    """`--set KEY=VALUE` as a run reads it (gpucert.config.loader): the key must exist in the config dataclasses
    and, unless the value is a placeholder, the value must have the key's type."""
    from gpucert.config.loader import ConfigError, apply_overrides, load_config
    from gpucert.config.run import RunConfig
    from gpucert.finetune.config import FinetuneConfig

    cls: type = FinetuneConfig if finetuning else RunConfig
    try:
        apply_overrides({}, cls, [item])
        if not is_placeholder(item.split("=", 1)[-1]):
            load_config(cls, config_path, [item])
    except ConfigError as exc:
        return [str(exc)]
    return []


def _check_launch(argv: list[str]) -> list[str]:
    """`gpucert launch BACKEND VERB` by launch's own parser, launch's own rules (ports, times), then the options it
    passes on as the launched verb reads them (`gpucert cluster fs` for fs)."""
    from gpucert.cli import _Parser
    from gpucert.launch.command import build_parser, launch_problems
    from gpucert.launch.slurm import VERB_ARGV

    parsed, message = parse_with(build_parser(_Parser), argv, "launch")
    if message:
        return [message]
    if parsed is None:
        return []
    args, rest = parsed
    problems = launch_problems(args)
    return problems + check_gpucert([*VERB_ARGV[args.verb][1:], *rest])


# ---------------------------------------------------------------- run


def expected_exit_codes(command: DocCommand) -> set[int]:
    """What the doc says (`# exits N`), else the contract: a judged verb's 0/1/2 is a run that worked (3 is an
    ERROR: nothing judged), `--npd` answers 0/1 (2 is unknown), everything else 0."""
    said = re.search(r"\bexits (\d+)", command.comment)
    if said:
        return {int(said.group(1))}
    tokens = words(command.text)
    last = unwrap(segments(tokens)[-1]) if segments(tokens) else []
    if last[:1] == ["gpucert"] and "--npd" in last:
        return {0, 1}
    judged = {"discover", "health", "accept", "bench", "report", "cluster", "evaluate", "finetune"}
    verb = next((w for w in last[1:] if not w.startswith("-")), "")
    if last[:1] == ["gpucert"] and verb in judged and "--list-recipes" not in last:
        return {0, 1, 2}
    return {0}


def runnable_text(command: DocCommand, scratch: Path) -> str:
    """The command as the test runs it: paths under /tmp/ moved into the test's scratch directory, and `gpucert
    launch slurm` without --dry-run given one (it would submit a job; the script is what is checked)."""
    text = re.sub(r"(?<![\w./-])/tmp/", f"{scratch}/tmp/", command.text)
    tokens = words(text)
    shell = OPERATORS | {">", ">>", "<"}
    if tokens[:3] == ["gpucert", "launch", "slurm"] and "--dry-run" not in tokens and not set(tokens) & shell:
        text += " --dry-run"
    return text


def scratch_directory(directory: Path) -> Path:
    """A working directory that reads like the checkout (configs/, tests/, ... linked) and writes into itself;
    its tmp/ stands for /tmp/."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("configs", "deploy", "docs", "tests", "tools"):
        (directory / name).symlink_to(REPO / name)
    (directory / "tmp").mkdir()
    return directory


def run_in_order(commands: list[DocCommand], directory: Path, timeout_s: float = 300) -> list[str]:
    """Run the commands one after the other, as printed, in a scratch directory made in `directory`; a failure
    for each that exits other than expected_exit_codes() says or prints a traceback, naming its file:line."""
    scratch = scratch_directory(directory)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    failures = []
    for command in commands:
        text = runnable_text(command, scratch)
        done = subprocess.run(
            ["bash", "-c", text], cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        expected = expected_exit_codes(command)
        if done.returncode not in expected or "Traceback" in done.stderr + done.stdout:
            tail = "\n".join((done.stderr.strip() or done.stdout.strip()).splitlines()[-8:])
            failures.append(f"{command.id}: `{text}` exited {done.returncode}, expected {sorted(expected)}:\n{tail}")
        elif words(text)[:3] == ["gpucert", "launch", "torchrun"]:
            # What it prints is what every node runs: those commands are checked as the doc's own are.
            for line in done.stdout.splitlines():
                if line.strip() and not line.startswith("#"):
                    printed = check_command(DocCommand(command.path, command.line, line.strip()))
                    failures += [f"printed by {problem}" for problem in printed.problems]
    return failures
