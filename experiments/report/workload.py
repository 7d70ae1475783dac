"""The report's workload section: what was sent (kind, how the chat template was applied, sources and
Python version for real text), the prompt-length distribution in the model's tokens, and per engine
and level how many requests ended at EOS (or a stop string) and how many at max tokens."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.report.md import fmt, table
from experiments.report.summary import Runs

TEMPLATE = {
    "harness": "the model's chat template applied once by the harness (as transformers' apply_chat_template "
               "with add_generation_prompt), the same token ids sent to every engine",
    "engine": "`messages` sent to each engine's own `/v1/chat/completions`, so each engine applied its own "
              "chat template (adapters without a chat route got the harness's rendering as token ids); the "
              "prompt lengths below are the harness's rendering, and the token-count checks compare each "
              "engine's own count with it",
    "none": "raw text, no chat template, tokenized once by the harness",
}


def _manifest(d: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    p = d / "workload.json"
    if p.is_file():
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError:
            pass
    w = cfg.get("workload") or {}  # a run from before workload.json: what the config says
    return {"kind": w.get("kind"), "seed": w.get("seed"), "template": w.get("template")}


def _dist(s: dict[str, Any] | None) -> str:
    if not s:
        return "–"
    return " / ".join(_num(s[k]) for k in ("min", "median", "p90", "max"))


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.1f}"


def _lengths(values: list[int]) -> dict[str, Any] | None:
    from experiments.workload.realtext import stats

    return stats(values) or None


def section(runs: Runs) -> list[str]:
    out: list[str] = []
    for d, cfg, _ in runs.configs:
        m = _manifest(d, cfg)
        sampling = cfg.get("sampling") or {}
        src = m.get("sources") or {}
        what = TEMPLATE.get(m.get("template") or "", "token ids made by the harness, no chat template")
        line = f"- `{d}`: kind **{m.get('kind')}**, seed {m.get('seed')}, {fmt(m.get('requests'))} requests; {what}."
        if src:
            line += (f" Text: {src.get('text')} of Python {src.get('python')} ({src.get('implementation')}); "
                     "the standard library's text differs between Python versions, and so do the ids.")
        out.append(line)
        out.append(f"- outputs: {'run to max tokens (`ignore_eos`)' if sampling.get('ignore_eos', True) else 'end at EOS (no `ignore_eos`) or max tokens'}.")
        if m.get("prompt_tokens"):
            out.append(f"- prompt tokens min / median / p90 / max: {_dist(m['prompt_tokens'])} "
                       f"(mean {_num(m['prompt_tokens']['mean'])}); max output tokens: {_dist(m.get('max_output_tokens'))}.")
    rows = []
    for e in runs.engines:
        for level, recs in e.records.items():
            eos = sum(r.get("finish_reason") == "stop" for r in recs)
            length = sum(r.get("finish_reason") == "length" for r in recs)
            outs = _lengths([len(r["output_token_ids"]) for r in recs])
            prompts = _lengths([len(r["prompt_token_ids"]) for r in recs])
            rows.append([e.label, level, fmt(len(recs)), fmt(eos), fmt(length), _dist(prompts), _dist(outs)])
    out += ["", "Where each request ended (`stop`: EOS or a stop string; `length`: max tokens), and its lengths "
            "in tokens (min / median / p90 / max):", ""]
    out += table(["engine", "level", "requests", "ended at EOS/stop", "ended at max tokens", "prompt tokens",
                  "output tokens"], rows) if rows else ["No requests finished."]
    return out
