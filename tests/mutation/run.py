"""Run the mutation suite: `python -m tests.mutation.run [--jobs N] [--discover] [NAME ...]`.

For each mutation of `tests/mutation/mutations.py` (all, or the NAMEs given): copy the
project's tracked files to a temporary directory, replace the mutation's `before` text (it
must occur exactly once: a stale list fails) by its `after` text, and run the mutation's
killer tests there with pytest (`-x`: the first failure kills it). A mutation is *killed*
when pytest reports failures, *survives* when its tests pass, and is an *error* when pytest
cannot run them (exit status other than 0 or 1). Prints one line per mutation with the test
that killed it and the seconds taken; exits 1 when any survived or erred, naming them.

`--discover` runs the whole fast suite (`tests/unit`) instead of the killers and prints
every test that fails: how a mutation's killers are found.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.mutation.mutations import MUTATIONS, Mutation

ROOT = Path(__file__).resolve().parents[2]
FAST_SUITE = ("tests/unit",)
#: bound on one mutation's run (seconds): a mutation that makes the suite hang is an error
TIMEOUT_S = 900


@dataclass(frozen=True)
class Outcome:
    """What became of one mutation: `verdict` killed, survived or error; `detail` the
    killing test (or the error); `failing` every failing test (in discovery); seconds."""

    mutation: Mutation
    verdict: str
    detail: str
    failing: tuple[str, ...]
    seconds: float


#: what a project copy leaves out when git cannot list the tracked files (not a repository)
_UNTRACKED = {".git", ".venv", ".tools", "var", "__pycache__", ".pytest_cache", ".mypy_cache",
              ".ruff_cache", ".hypothesis", ".import_linter_cache", "site"}


def tracked_files() -> list[str]:
    """The project's files as git tracks them (the working tree's content); outside a git
    repository (a service just made by copier), every file but caches and environments."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = [str(path.relative_to(ROOT)) for path in ROOT.rglob("*")
                  if not _UNTRACKED & set(path.relative_to(ROOT).parts)]
    return [f for f in listed if f and (ROOT / f).is_file()]


def copy_project(files: list[str], into: Path) -> None:
    """Copy `files` (relative to the project) into `into`, keeping symbolic links and
    modification times, with the bytecode compiled beside them (`__pycache__`, where the
    project has it: `./dev mutate` compiles it first), so a mutation's run does not compile
    the project again. A mutated file's bytecode no longer matches its source (its time and
    size) and is compiled again as Python reads it."""
    caches = set()
    for name in files:
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target, follow_symlinks=False)
        if name.endswith(".py"):
            caches.add(Path(name).parent / "__pycache__")
    for cache in caches:
        if (ROOT / cache).is_dir():
            shutil.copytree(ROOT / cache, into / cache, dirs_exist_ok=True)


def apply(mutation: Mutation, root: Path) -> None:
    """Apply `mutation` under `root`; ValueError when a `before` text is not there once."""
    for file, before, after in mutation.edits:
        path = root / file
        text = path.read_text()
        found = text.count(before)
        if found != 1:
            raise ValueError(f"{mutation.name}: its `before` text occurs {found} times in "
                             f"{file} (the code moved: update the mutation)")
        path.write_text(text.replace(before, after))


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def run_one(mutation: Mutation, files: list[str], discover: bool) -> Outcome:
    """Apply `mutation` to a copy of the project and run its tests there."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"eo-mutant-{mutation.name}-") as temp:
        root = Path(temp)
        copy_project(files, root)
        try:
            apply(mutation, root)
        except ValueError as exc:
            return Outcome(mutation, "error", str(exc), (), time.monotonic() - started)
        tests = list(FAST_SUITE) if discover else list(mutation.killers)
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
                "--tb=no", *([] if discover else ["-x"]), *tests]
        # a killing campaign stops at its first violating run (`eo chaos --fail-fast`): the
        # runs after it cannot make the test pass again
        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1",
               "EO_CHAOS_FAIL_FAST": "1"}
        try:
            done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Outcome(mutation, "error", f"no result within {TIMEOUT_S} s", (),
                           time.monotonic() - started)
    seconds = time.monotonic() - started
    failing = tuple(_FAILED.findall(done.stdout))
    if done.returncode == 0:
        return Outcome(mutation, "survived", "every killer test passed", (), seconds)
    if done.returncode == 1 and failing:
        return Outcome(mutation, "killed", failing[0], failing, seconds)
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return Outcome(mutation, "error", f"pytest exit {done.returncode}: {' | '.join(tail)}",
                   failing, seconds)


def main(argv: list[str] | None = None) -> int:
    """Run the mutations (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)),
                        help="mutations run at once (default: one per CPU)")
    parser.add_argument("--discover", action="store_true",
                        help="run the whole fast suite and list every failing test")
    options = parser.parse_args(argv)
    by_name = {m.name: m for m in MUTATIONS}
    unknown = [n for n in options.names if n not in by_name]
    if unknown:
        parser.error(f"unknown mutations {unknown}; known: {sorted(by_name)}")
    chosen = [by_name[n] for n in options.names] or list(MUTATIONS)
    files = tracked_files()
    started = time.monotonic()
    print(f"mutation suite: {len(chosen)} mutations, {options.jobs} at a time", flush=True)
    outcomes = []
    with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
        futures = [pool.submit(run_one, m, files, options.discover) for m in chosen]
        for future in concurrent.futures.as_completed(futures):
            outcome = future.result()
            outcomes.append(outcome)
            m = outcome.mutation
            print(f"{outcome.verdict:8} {m.name:42} {outcome.seconds:6.1f} s  "
                  f"{outcome.detail}", flush=True)
            if options.discover:
                for test in outcome.failing:
                    print(f"           {test}")
    bad = [o.mutation.name for o in outcomes if o.verdict != "killed"]
    print(f"{len(outcomes) - len(bad)} of {len(outcomes)} killed in "
          f"{time.monotonic() - started:.0f} s" + (f"; NOT KILLED: {', '.join(bad)}" if bad
                                                   else ""), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
