"""How long `eo` takes to start: `python -m tools.bench.startup [--runs N] [COMMAND ...]`.

Runs `eo consume --help` (or the given `eo` arguments) N times as a whole process, prints
the minimum, median and maximum wall time, and the modules whose import took longest
(`python -X importtime`). A benchmark that prints figures, not a test: the target (under
1 s on an idle machine) is for a person to read, the figures move with the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

EO = [sys.executable, "-c", "from entrypoints.cli import main; main()"]
ROOT = Path.cwd()  # the project whose `eo` is timed (run it from there)


def wall_times(args: list[str], runs: int) -> list[float]:
    """Seconds each of `runs` runs of `eo <args>` took, start to exit."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([*EO, *args], cwd=ROOT, capture_output=True, check=True)
        times.append(time.perf_counter() - started)
    return times


def slowest_imports(args: list[str], top: int = 10) -> list[tuple[float, str]]:
    """The `top` modules with the longest cumulative import time (seconds) in one run."""
    done = subprocess.run([sys.executable, "-X", "importtime", *EO[1:], *args], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    found = []
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            found.append((int(parts[1]) / 1e6, parts[2].rstrip()))
    return sorted(found, reverse=True)[:top]


def main() -> None:
    """Print the start-up times of `eo` (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("command", nargs="*", default=["consume", "--help"])
    options = parser.parse_args()
    times = wall_times(options.command, options.runs)
    print(f"eo {' '.join(options.command)}: {options.runs} runs, min {min(times):.3f} s, "
          f"median {statistics.median(times):.3f} s, max {max(times):.3f} s")
    print("slowest imports (cumulative, one run):")
    for seconds, module in slowest_imports(options.command):
        print(f"  {seconds:6.3f} s  {module}")


if __name__ == "__main__":
    main()
