"""Pull measured tables from `results/` and `docs/perf/` into the handbook's chapters.

A chapter marks where a table goes:

    <!-- table: quickstart-throughput -->
    (generated: never edit by hand)
    <!-- /table: quickstart-throughput -->

`TABLES` says where each named table comes from: a markdown file, the section (heading) it sits
under or a word in its header row, and optionally which rows and columns to keep. Running the
script rewrites every marked region from its source; `--check` changes nothing and exits 1 when a
region is out of date (the tests run it), so a re-measured report shows up in the handbook the
next time someone runs the script, never by hand-copying numbers.

    python docs/handbook/build_tables.py            # rewrite the regions
    python docs/handbook/build_tables.py --check    # exit 1 if any region differs
    python docs/handbook/build_tables.py --list     # the tables, their sources and where they go
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HANDBOOK = ROOT / "docs" / "handbook"
H200 = "docs/perf/2026-11-30-gpu-check-h200.md"
QUICK = "results/quickstart/report.md"
COMPARE = "results/compare/report.md"
SWEEP = "docs/perf/2026-12-04-handbook-measure-sweep.md"  # written by labs/15_measure.py --full --out


@dataclass
class Table:
    source: str  # path from the repository root
    section: str | None = None  # the "## heading" the table sits under (its start)
    header_has: str | None = None  # or: the first table whose header row contains this
    rows: str | None = None  # keep rows whose first two cells match this regex
    columns: tuple[str, ...] | None = None  # keep these columns, in this order
    optional: bool = False  # a source not measured yet says so instead of failing


TABLES: dict[str, Table] = {
    "h200-greedy-agreement": Table(H200, header_has="identical to HF"),
    "h200-decode-speed": Table(H200, header_has="output tokens/s"),
    "quickstart-engines": Table(QUICK, section="Engines",
                                columns=("engine", "status", "mode", "version", "dtype", "KV capacity (tokens)")),
    "quickstart-latency": Table(QUICK, section="Latency", rows=r"(TTFT|TPOT|ITL) median"),
    "quickstart-throughput": Table(QUICK, section="Throughput", rows=r"output tokens/s|requests/s"),
    "quickstart-memory": Table(QUICK, section="Memory", rows=r"peak RSS|KV capacity|peak KV usage|mean running"),
    "quickstart-hardware": Table(QUICK, section="How far from the hardware",
                                 rows=r"bytes per decode step|median TPOT|achieved GB/s"),
    "quickstart-agreement": Table(QUICK, section="Greedy-token agreement"),
    "compare-throughput": Table(COMPARE, section="Throughput", rows=r"output tokens/s|requests/s", optional=True),
    "compare-latency": Table(COMPARE, section="Latency", rows=r"(TTFT|TPOT|ITL) median", optional=True),
    "measure-sweep": Table(SWEEP, section="Sweep"),
}
BEGIN = re.compile(r"<!-- table: ([\w-]+) -->\n(.*?)<!-- /table: \1 -->", re.S)


def markdown_tables(text: str) -> list[tuple[str | None, list[list[str]]]]:
    """Every table in a markdown text, with the nearest "#" heading above it: (heading, rows of cells)."""
    out, heading, block = [], None, []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if block:
            out.append((heading, block))
            block = []
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
    return out


def select(spec: Table, text: str) -> list[list[str]]:
    for heading, rows in markdown_tables(text):
        h = heading or ""
        if spec.section and h != spec.section and not h.startswith(spec.section + " ("):  # "X (estimate)" is X
            continue
        if spec.header_has and not any(spec.header_has in c for c in rows[0]):
            continue
        header, body = rows[0], rows[2:]  # rows[1] is the |---| separator
        if spec.rows:
            body = [r for r in body if re.search(spec.rows, " ".join(r[:2]))]
        if spec.columns:
            idx = [header.index(c) for c in spec.columns]
            header, body = [header[i] for i in idx], [[r[i] for i in idx] for r in body]
        if not body:  # a selector that keeps nothing is broken, not an empty measurement
            raise LookupError(f"the table in section {heading!r} of {spec.source} has no row matching {spec.rows!r}")
        return [header] + body
    raise LookupError(f"no table in section {spec.section!r} / header with {spec.header_has!r} in {spec.source}")


def provenance(text: str) -> str:
    """What made the report: its `- command:` line (harness reports) or its first heading."""
    m = re.search(r"^- command: `([^`]+)`", text, re.M)
    if m:
        return f"made by `{m.group(1)}`"
    m = re.search(r"^# (.+)$", text, re.M)
    return f"from \"{m.group(1)}\"" if m else ""


def render(name: str, chapter: Path) -> str:
    spec = TABLES[name]
    src = ROOT / spec.source
    if not src.is_file():
        if spec.optional:
            return f"_Not measured yet: `{spec.source}` does not exist in this checkout._\n"
        raise FileNotFoundError(f"table {name}: {spec.source} is missing")
    text = src.read_text()
    rows = select(spec, text)
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    where = f"section \"{spec.section}\"" if spec.section else f"the table with \"{spec.header_has}\""
    kept = f", rows matching `{spec.rows}`" if spec.rows else ""
    rel = Path("../" * len(chapter.parent.relative_to(ROOT).parts)) / spec.source
    lines.append("")
    lines.append(f"<sub>Source: [`{spec.source}`]({rel.as_posix()}), {where}{kept}; {provenance(text)}. "
                 f"Pulled by `docs/handbook/build_tables.py` (table `{name}`).</sub>")
    return "\n".join(lines) + "\n"


def rebuild(path: Path) -> str:
    def sub(m: re.Match) -> str:
        if m.group(1) not in TABLES:
            raise KeyError(f"{path.name}: unknown table {m.group(1)!r}; known: {', '.join(TABLES)}")
        return f"<!-- table: {m.group(1)} -->\n{render(m.group(1), path)}<!-- /table: {m.group(1)} -->"

    return BEGIN.sub(sub, path.read_text())


def regions(path: Path) -> list[str]:
    return [m.group(1) for m in BEGIN.finditer(path.read_text())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if any region is out of date; write nothing")
    ap.add_argument("--list", action="store_true", help="list the tables and where they are used")
    args = ap.parse_args(argv)
    chapters = sorted(HANDBOOK.glob("*.md"))
    if args.list:
        used = {n: [c.name for c in chapters if n in regions(c)] for n in TABLES}
        for n, t in TABLES.items():
            print(f"{n:24} {t.source} [{t.section or t.header_has}] -> {', '.join(used[n]) or '(unused)'}")
        return 0
    stale = []
    for c in chapters:
        new = rebuild(c)
        if new != c.read_text():
            stale.append(c.name)
            if not args.check:
                c.write_text(new)
    if args.check:
        print(f"out of date: {', '.join(stale)} (run python docs/handbook/build_tables.py)" if stale
              else f"tables up to date in {len(chapters)} files")
        return 1 if stale else 0
    print(f"rewrote {', '.join(stale)}" if stale else "nothing to change")
    return 0


if __name__ == "__main__":
    sys.exit(main())
