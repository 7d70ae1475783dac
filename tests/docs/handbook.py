"""Reading the handbook for the tests: fenced blocks, links, runnable commands, symbols in Python files."""
from __future__ import annotations

import ast
import re
import shlex
from functools import cache
from pathlib import Path

from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[2]
HANDBOOK = REPO / "docs" / "handbook"
LABS = HANDBOOK / "labs"
CHAPTERS = sorted(HANDBOOK.glob("[0-9][0-9]-*.md"))
PAGES = [HANDBOOK / "README.md", *CHAPTERS]
RUNNABLE = "bash runnable"


@cache
def tokens(path: Path):
    return MarkdownIt().parse(path.read_text())


def fences(path: Path, info: str) -> list[str]:
    return [t.content for t in tokens(path) if t.type == "fence" and t.info.strip() == info]


def links(path: Path) -> list[str]:
    out = []
    for t in tokens(path):
        for child in t.children or ():
            if child.type == "link_open":
                out.append(child.attrs["href"])
    return out


def commands(path: Path) -> list[list[str]]:
    """argv of every command in the page's runnable blocks (comments and blank lines skipped)."""
    out = []
    for block in fences(path, RUNNABLE):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(shlex.split(line))
    return out


def all_commands() -> list[tuple[str, list[str]]]:
    return [(p.name, argv) for p in PAGES for argv in commands(p)]


@cache
def symbols(path: Path) -> set[str]:
    """Dotted names defined in a Python file: functions, classes, their methods, module and class assignments."""
    names: set[str] = set()

    def walk(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + node.name)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.Assign):
                names.update(prefix + t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(prefix + node.target.id)

    walk(ast.parse(path.read_text()).body, "")
    return names


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def headings(path: Path) -> set[str]:
    toks = tokens(path)
    return {slug(toks[i + 1].content) for i, t in enumerate(toks) if t.type == "heading_open"}


def resolve(page: Path, href: str) -> str | None:
    """None if a relative link resolves (file exists; #symbol defined / #heading present), else the problem."""
    if re.match(r"^[a-z]+:", href):
        return None if href.startswith(("https://", "http://")) else f"unexpected scheme: {href}"
    target, _, anchor = href.partition("#")
    path = (page.parent / target).resolve() if target else page
    if not path.exists():
        return f"{href}: {path} does not exist"
    if not anchor:
        return None
    if path.suffix == ".py":
        return None if anchor in symbols(path) else f"{href}: no symbol {anchor!r} in {path.name}"
    if path.suffix == ".md":
        return None if anchor in headings(path) else f"{href}: no heading #{anchor} in {path.name}"
    return f"{href}: anchors are only checked in .py and .md files"


def num(pattern: str, out: str, cast=int):
    """The first group of `pattern` in a lab's output, as a number (thousands separators dropped)."""
    m = re.search(pattern, out)
    assert m, f"lab output has no match for {pattern!r}"
    return cast(m.group(1).replace(",", ""))


def quoted(text: str, *phrases: str) -> None:
    """Every phrase is in the chapter's text."""
    missing = [p for p in phrases if p not in text]
    assert not missing, f"the chapter does not say {missing}"
