"""The audit's report for people: `report.md` with the counts and what each finding means
(`Finding.meaning`: the protocol's in the framework's terms, a domain check's in its own), a
bar chart of them (`counts.png`, matplotlib's Agg backend, no display needed) and the first
offending rows."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from tools.pipeline.audit import MEANINGS, AuditResult

CENT = Decimal("0.01")


def chart(result: AuditResult, path: Path) -> Path:
    """A horizontal bar chart of the violation counts per finding (and dead letters per
    endpoint) as a PNG at `path`; returns `path`."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    labels = list(result.counts) + [f"dead letters: {e}" for e in result.dead_letters]
    values = list(result.counts.values()) + [n or 0 for n in result.dead_letters.values()]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(labels) + 1.2), dpi=100)
    colours = ["#c0392b" if v else "#27ae60" for v in values]
    bars = ax.barh(labels[::-1], values[::-1], color=colours[::-1])
    ax.bar_label(bars, labels=[f"{v:,}" for v in values[::-1]], padding=3)
    ax.set_xlabel("offending rows")
    ax.set_title(f"eo pipeline audit: {result.violations:,} violation(s)")
    ax.set_xlim(0, max([*values, 1]) * 1.15)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _cell(value: Any) -> str:
    if isinstance(value, list):
        value = ", ".join(str(v) for v in value)
    elif isinstance(value, Decimal):  # amounts are decimal(38,10): show cents when exact
        cents = value.quantize(CENT)
        value = cents if cents == value else value.normalize()
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(rows: list[dict[str, Any]]) -> list[str]:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in rows]
    return lines


def markdown(result: AuditResult, chart_name: str = "counts.png") -> str:
    """The report's Markdown: verdict, counts table, chart, timed stages, sample rows."""
    verdict = ("**PASS**: no violation" if result.violations == 0
               else f"**FAIL**: {result.violations:,} violation(s)")
    lines = ["# eo pipeline audit", "", verdict, "",
             f"Threshold: objects, tokens and transaction records older than "
             f"{result.cutoff.isoformat()} count.", "",
             "| finding | rows | meaning | Parquet |", "|---|---:|---|---|"]
    for name, count in result.counts.items():
        meaning = result.meanings.get(name) or MEANINGS.get(name, "")
        lines.append(f"| {name} | {count:,} | {meaning} | `{name}/` |")
    for endpoint, depth in result.dead_letters.items():
        shown = "no queue" if depth is None else f"{depth:,}"
        lines.append(f"| dead letters: {endpoint} | {shown} | messages in `{endpoint}.dlq` | |")
    lines += ["", f"![violation counts]({chart_name})", "", "## Stages", "",
              "| stage | seconds | rows | rows/s |", "|---|---:|---:|---:|"]
    for s in result.stages:
        rate = f"{s.rows_per_s:,.0f}" if s.rows_per_s else ""
        counted = f"{s.rows:,}" if s.rows else ""
        lines.append(f"| {s.name} | {s.seconds:.2f} | {counted} | {rate} |")
    for name, sample in result.samples.items():
        if sample:
            lines += ["", f"## {name}: first {len(sample)} of {result.counts[name]:,}", "",
                      *_table(sample)]
    return "\n".join(lines) + "\n"


def write_report(result: AuditResult) -> Path:
    """`report.md` and `counts.png` in the audit's output directory; returns report.md."""
    chart(result, result.output / "counts.png")
    path = result.output / "report.md"
    path.write_text(markdown(result))
    return path
