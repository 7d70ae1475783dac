"""The report's "Answers" section: one prompt of a real-text workload and each engine's answer to it.

The other sections say how fast; this one says what came back, so a reader sees that every engine
answered the same question with readable text (or sees where one did not). Shown only for workloads
of real text: the answers to random token ids are noise. The prompt is decoded with the model's
tokenizer with special tokens kept, so the chat template the engines received is visible; each answer
is the engine's own text as it streamed it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.report.md import fmt, table
from experiments.report.summary import Runs

MAX_PROMPT_CHARS = 1200  # a summarisation prompt is thousands of characters: show its end, where the question is


def _cell(text: str) -> str:
    """Markdown table cell: one line, pipes escaped."""
    return text.strip().replace("|", "\\|").replace("\r", "").replace("\n", "<br>") or "(empty)"


def _pick(runs: Runs, level: str) -> str | None:
    """The first request (by id) that every engine finished at `level`, preferring one that ended at EOS."""
    ids = [{r["request_id"]: r for r in e.records.get(level, [])} for e in runs.engines if e.records]
    common = sorted(set.intersection(*(set(i) for i in ids))) if ids else []
    base = {r["request_id"]: r for r in runs.baseline.records.get(level, [])}
    return next((rid for rid in common if base[rid].get("finish_reason") == "stop"), common[0] if common else None)


def _decode(model: str | None, ids: list[int], special: bool = True) -> str | None:
    from experiments.workload.workloads import load_tokenizer

    try:
        return load_tokenizer(Path(model)).decode(ids, skip_special_tokens=not special) if model else None
    except (ValueError, OSError):
        return None


def section(runs: Runs) -> list[str]:
    base = runs.baseline
    if base is None:
        return []
    cfg: dict[str, Any] = next(c for d, c, _ in runs.configs if d == base.run_dir)
    if (cfg.get("workload") or {}).get("kind", "random") == "random":
        return []
    level = next(iter(base.records))
    rid = _pick(runs, level)
    if rid is None:
        return []
    recs = {e.label: next(r for r in e.records[level] if r["request_id"] == rid) for e in runs.engines if e.records}
    prompt = _decode(cfg.get("model"), recs[base.label]["prompt_token_ids"])
    shown = prompt if prompt is None or len(prompt) <= MAX_PROMPT_CHARS else "…" + prompt[-MAX_PROMPT_CHARS:]
    out = [f"Request `{rid}` at {level}, {fmt(len(recs[base.label]['prompt_token_ids']))} prompt tokens"
           + (" (decoded with the model's tokenizer, special tokens kept):" if shown is not None else
              " (no tokenizer to decode it with)."), ""]
    if shown is not None:
        out += ["```text", shown.rstrip(), "```", ""]
    rows, decoded = [], False
    for label, r in recs.items():
        same = "–" if label == base.label else ("yes" if r["output_token_ids"] == recs[base.label]["output_token_ids"] else "**no**")
        text = r.get("text") or ""
        if not text and r["output_token_ids"]:  # an adapter whose events carry no text (the HF baseline)
            text, decoded = (_decode(cfg.get("model"), r["output_token_ids"], special=False) or "") + " †", True
        rows.append([label, r.get("finish_reason") or "–", fmt(len(r["output_token_ids"])), same, _cell(text)])
    out += table(["engine", "ended", "output tokens", f"tokens identical to {base.label}'s", "answer"], rows)
    return out + (["", "† the engine streamed token ids only; the harness decoded them with the model's tokenizer."]
                  if decoded else [])
