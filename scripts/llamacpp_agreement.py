"""Greedy agreement with llama.cpp, every id: the prompts the reference engine answered in a cell of a run
(its requests.jsonl, concurrency=1, repeat 1), asked again of llama-server one at a time with stream false
(its final result carries every id; the stream drops the ids of tokens that end mid-character) and
cache_prompt false, compared token by token with the reference engine's outputs.

    python scripts/llamacpp_agreement.py results/cpu_vs_llamacpp/smollm2-fp32
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adapters.registry import create  # noqa: E402


async def main(cell: Path) -> None:
    cfg = json.loads((cell / "config.json").read_text())
    ref = [json.loads(line) for line in (cell / "reference" / "requests.jsonl").open()]
    ref = [r for r in ref if r["level"] == "concurrency=1" and r.get("repeat", 1) == 1]
    longest = max(len(r["prompt_token_ids"]) + len(r["output_token_ids"]) for r in ref)
    eng = create("llamacpp", cfg["model"], cfg["dtype"], {"max_num_seqs": 1, "max_model_len": longest})
    info = await eng.start()
    same, first = 0, []
    try:
        async with httpx.AsyncClient(base_url=info.knobs["url"], timeout=300) as client:
            for r in ref:
                body = {"prompt": r["prompt_token_ids"], "n_predict": len(r["output_token_ids"]), "return_tokens": True,
                        "ignore_eos": True, "cache_prompt": False, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                        "min_p": 0.0}
                got, want = (await client.post("/completion", json=body)).json()["tokens"], r["output_token_ids"]
                same += got == want
                first.append(next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None))
    finally:
        await eng.stop()
    print(f"{cell}: llama.cpp {info.version} ({info.dtype}) against the reference engine: {same}/{len(ref)} outputs "
          f"identical; where the others first differ (token index): {sorted(i for i in first if i is not None)}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
