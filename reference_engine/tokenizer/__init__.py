"""Text <-> token ids: `tokenizer` (an HF `tokenizer.json` through the `tokenizers` library, chat
templates, streaming detokenization) and `make` (trains the small BPE tokenizer the generated models use).
"""
