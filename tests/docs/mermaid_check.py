"""A structural checker for the mermaid diagrams the handbook uses (no node.js needed).

`check(source) -> list[str]` returns problems, one per line at fault; empty means the diagram
passes. It knows flowchart/graph, sequenceDiagram and stateDiagram(-v2) statement by statement
and rejects anything else, so a diagram type we do not check cannot slip through. Checked: the
diagram type on the first line; balanced brackets and quotes; every flowchart statement is a
chain of nodes joined by known arrows (optionally labelled), with subgraph/end balanced; every
sequence line is a participant, a message `A->>B: text`, a note, or a balanced block
(loop/alt/else/opt/par/and/critical/break/rect ... end); every state line a transition
`A --> B[: label]`, a description, a `state` declaration or note, with braces balanced.
"""
from __future__ import annotations

import re

FLOW_DIRS = {"TB", "TD", "BT", "RL", "LR"}
ID = r"[A-Za-z0-9_]+"
# node shapes, longest opener first: opener -> closer
SHAPES = [("(((", ")))"), ("([", "])"), ("[[", "]]"), ("[(", ")]"), ("((", "))"), ("{{", "}}"), ("[/", "/]"),
          ("[\\", "\\]"), (">", "]"), ("[", "]"), ("(", ")"), ("{", "}")]
ARROW = re.compile(r"\s*(<?(?:--+|==+|-\.+-)(?:>|o|x)?)\s*(\|[^|]*\|)?\s*")
TEXT_ARROW = re.compile(r"\s*(--|==|-\.)\s+[^-=.>|][^>]*?\s+(--+>|==+>|\.-+>|--+|==+)\s*")
FLOW_KEYWORDS = ("classDef ", "class ", "style ", "linkStyle ", "click ", "direction ")
SEQ_ARROW = re.compile(rf"^({ID})\s*(-->>|->>|-->|->|--x|-x|--\)|-\))\s*[+-]?({ID})\s*:\s*\S.*$")
SEQ_BLOCKS = {"loop", "alt", "opt", "par", "critical", "break", "rect"}
SEQ_INNER = {"else": "alt", "and": "par", "option": "critical"}


def _balanced(line: str) -> str | None:
    """None if brackets and double quotes balance (brackets inside quotes ignored)."""
    if line.count('"') % 2:
        return "unbalanced double quote"
    stack, pairs = [], {")": "(", "]": "[", "}": "{"}
    for part in line.split('"')[::2]:  # outside quotes only
        for ch in part:
            if ch in "([{":
                stack.append(ch)
            elif ch in pairs:
                if not stack or stack.pop() != pairs[ch]:
                    return f"unbalanced {ch!r}"
    return f"unclosed {stack[-1]!r}" if stack else None


def _node(s: str, i: int) -> int:
    """Parse `ID[shape]` at s[i:]; return the index after it or raise ValueError."""
    m = re.compile(ID).match(s, i)
    if not m:
        raise ValueError(f"expected a node id at {s[i:i + 20]!r}")
    i = m.end()
    for op, cl in SHAPES:
        if s.startswith(op, i):
            j, in_q = i + len(op), False
            while j < len(s):
                if s[j] == '"':
                    in_q = not in_q
                elif not in_q and s.startswith(cl, j):
                    return j + len(cl)
                j += 1
            raise ValueError(f"node shape {op!r} never closed with {cl!r}")
    return i


def _flow_statement(s: str) -> None:
    i = _node(s, 0)
    while True:
        while s.startswith(" ", i):
            i += 1
        if i >= len(s):
            return
        if s.startswith("&", i):
            i += 1
            while s.startswith(" ", i):
                i += 1
            i = _node(s, i)
            continue
        m = TEXT_ARROW.match(s, i) or ARROW.match(s, i)
        if not m or m.end() == i:
            raise ValueError(f"expected an arrow at {s[i:i + 20]!r}")
        i = m.end()
        if i >= len(s):
            raise ValueError("arrow with no target")
        i = _node(s, i)


def _split_statements(line: str) -> list[str]:
    """Split on ';' outside double quotes (';' separates statements)."""
    out, cur, in_q = [], "", False
    for ch in line:
        if ch == '"':
            in_q = not in_q
        if ch == ";" and not in_q:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


def _flowchart(lines) -> list[str]:
    errs, depth = [], 0
    for n, line in lines:
        if line.startswith("subgraph"):
            depth += 1
            if not re.fullmatch(rf"subgraph\s+({ID})(\s*\[.*\])?(\s+.*)?", line) and line != "subgraph":
                errs.append(f"line {n}: malformed subgraph: {line}")
        elif line == "end":
            depth -= 1
            if depth < 0:
                errs.append(f"line {n}: 'end' without subgraph")
                depth = 0
        elif line.startswith(FLOW_KEYWORDS):
            continue
        else:
            for stmt in filter(None, (x.strip() for x in _split_statements(line))):
                try:
                    _flow_statement(stmt)
                except ValueError as e:
                    errs.append(f"line {n}: {e}: {line}")
    if depth:
        errs.append(f"{depth} subgraph(s) not closed with 'end'")
    return errs


def _sequence(lines) -> list[str]:
    errs, stack = [], []
    for n, line in lines:
        word = line.split()[0]
        if word in ("participant", "actor"):
            if not re.fullmatch(rf"(participant|actor)\s+{ID}(\s+as\s+\S.*)?", line):
                errs.append(f"line {n}: malformed participant: {line}")
        elif word == "Note":
            if not re.fullmatch(rf"Note\s+(left of|right of|over)\s+{ID}(\s*,\s*{ID})?\s*:\s*\S.*", line):
                errs.append(f"line {n}: malformed note: {line}")
        elif word in SEQ_BLOCKS:
            stack.append(word)
        elif word in SEQ_INNER:
            if not stack or stack[-1] != SEQ_INNER[word]:
                errs.append(f"line {n}: '{word}' outside a '{SEQ_INNER[word]}' block")
        elif line == "end":
            if not stack:
                errs.append(f"line {n}: 'end' without a block")
            else:
                stack.pop()
        elif word in ("activate", "deactivate", "autonumber", "box"):
            continue
        elif not SEQ_ARROW.match(line):
            errs.append(f"line {n}: not a message 'A->>B: text': {line}")
    if stack:
        errs.append(f"block(s) {stack} not closed with 'end'")
    return errs


def _state(lines) -> list[str]:
    errs, depth, in_note = [], 0, False
    node = rf"(\[\*\]|{ID})"
    for n, line in lines:
        if in_note:
            in_note = line != "end note"
            continue
        if line.startswith("note "):
            if ":" not in line:
                in_note = True
            continue
        if line == "}":
            depth -= 1
            if depth < 0:
                errs.append(f"line {n}: '}}' without 'state ... {{'")
                depth = 0
        elif line.startswith("state "):
            if line.endswith("{"):
                depth += 1
            elif not re.fullmatch(rf'state\s+("[^"]*"\s+as\s+{ID}|{ID}(\s+<<\w+>>)?)', line):
                errs.append(f"line {n}: malformed state declaration: {line}")
        elif line.startswith("direction ") or line == "--":
            continue
        elif not (re.fullmatch(rf"{node}\s*-->\s*{node}(\s*:\s*\S.*)?", line)
                  or re.fullmatch(rf"{ID}\s*:\s*\S.*", line)):
            errs.append(f"line {n}: not a transition 'A --> B[: label]' or a description: {line}")
    if depth:
        errs.append("'state ... {' not closed")
    if in_note:
        errs.append("note not closed with 'end note'")
    return errs


def check(source: str) -> list[str]:
    raw = [(n, ln.strip()) for n, ln in enumerate(source.splitlines(), 1)]
    lines = [(n, ln) for n, ln in raw if ln and not ln.startswith("%%")]
    if not lines:
        return ["empty diagram"]
    (_, head), body = lines[0], lines[1:]
    kind = head.split()[0]
    if kind.startswith("stateDiagram"):  # a composite state's braces span lines: checked by _state
        body_b = [(n, ln[:-1] if ln.startswith("state ") and ln.endswith("{") else ln) for n, ln in body if ln != "}"]
    else:
        body_b = body
    errs = [f"line {n}: {e}: {ln}" for n, ln in body_b if (e := _balanced(ln))]
    if kind in ("flowchart", "graph"):
        if len(head.split()) > 1 and head.split()[1] not in FLOW_DIRS:
            errs.append(f"unknown flowchart direction in {head!r}")
        errs += _flowchart(body)
    elif kind == "sequenceDiagram":
        errs += _sequence(body)
    elif kind in ("stateDiagram-v2", "stateDiagram"):
        errs += _state(body)
    else:
        errs.append(f"unknown or unchecked diagram type {kind!r}")
    if not body:
        errs.append("diagram has no statements")
    return errs
