"""Lab 01 — tokenization: text -> ids -> text, and why streaming needs care.

Smallest working piece: one `Tokenizer.encode` call. Then the pieces a server needs: the character
span of every token, and an incremental detokenizer that never emits half a character.

    python docs/handbook/labs/01_tokenize.py [--model DIR] [--real-model DIR] [--text "..."]
"""
import argparse

from reference_engine.tokenizer.tokenizer import IncrementalDetokenizer, Tokenizer
from reference_engine.engine.trace import resolve_model, resolve_real_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
ap.add_argument("--real-model", help="a real model directory (default: models/smollm2-135m-instruct, made if absent)")
ap.add_argument("--text", default="Paged KV caches don't waste memory: naïve ones do.")
args = ap.parse_args()
tok = Tokenizer(resolve_model(args.model))

# 1. One encode: the model only ever sees these integers.
ids, spans = tok.encode_with_offsets(args.text)
print(f"text: {args.text!r}  ({len(args.text)} chars, {len(args.text.encode())} UTF-8 bytes)")
print(f"ids:  {ids}  ({len(ids)} tokens; vocabulary {tok.vocab_size:,})")
for i, (t, (s, e)) in enumerate(zip(ids, spans)):
    special = " (special)" if tok.is_special(t) else ""
    print(f"  {i:2d}  id {t:5d}  piece {tok.id_to_token(t)!r:18}  text {args.text[s:e]!r}{special}")

# 2. Round trip: decode(encode(x)) == x for this byte-level BPE (special tokens skipped).
assert tok.decode(ids) == args.text, "round trip changed the text"
print("decode(encode(text)) == text: True")

# 3. Streaming: decoding token by token can cut a multi-byte character in two. The incremental
#    detokenizer holds such tokens back until the character is complete.
detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
body = [t for t in ids if not tok.is_special(t)]
deltas = [detok.add([t]) for t in body] + [detok.flush()]
print("stream deltas:", deltas)
print("naive per-token decode:", [tok.decode([t]) for t in body])
assert "".join(deltas) == args.text

# 4. A real vocabulary and a chat template: SmolLM2-135M-Instruct's BPE (trained on far more text) merges
#    more, and an instruct model reads its messages wrapped in special tokens by its chat template.
real = Tokenizer(resolve_real_model(args.real_model))
rids = real.encode(args.text, add_special_tokens=False)
print(f"SmolLM2-135M-Instruct (vocabulary of {real.vocab_size:,}): {len(rids)} text tokens, "
      f"{len(args.text) / len(rids):.1f} characters per token (the tiny vocabulary: {len(body)}, "
      f"{len(args.text) / len(body):.1f})")
print("  pieces:", [real.decode([t]) for t in rids])
prompt = real.apply_chat_template([{"role": "user", "content": args.text}], add_generation_prompt=True)
pids = real.encode(prompt, add_special_tokens=False)
specials = [real.id_to_token(t) for t in pids if real.is_special(t)]
print(f"chat template -> {prompt!r}")
print(f"  {len(pids)} tokens for a {len(rids)}-token message: {len(pids) - len(rids)} added by the template, "
      f"special tokens {specials}")
