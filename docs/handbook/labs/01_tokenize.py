"""Lab 01 — tokenization: text -> ids -> text, and why streaming needs care.

Smallest working piece: one `Tokenizer.encode` call. Then the pieces a server needs: the character
span of every token, and an incremental detokenizer that never emits half a character.

    python docs/handbook/labs/01_tokenize.py [--model DIR] [--text "..."]
"""
import argparse

from reference_engine.tokenizer import IncrementalDetokenizer, Tokenizer
from reference_engine.trace import resolve_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
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
