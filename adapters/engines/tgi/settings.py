"""TGI's facts, per release: the version table (what each release's server reports, the metric names it
exports), the pinned image, the launch log lines the adapter reads its settings from, and what TGI cannot
do of the uniform features. Each fact cites upstream at the tag (tests/adapters/fixtures/tgi/SOURCE.md,
upstream.json); adapter.py is the adapter that uses them."""
from __future__ import annotations

import re
from typing import Any

from adapters.common import features
from adapters.common.readback import AS_REQUESTED, ReadBack
from adapters.common.versions import Row, VersionTable
from adapters.transport.metric_names import MetricNames

# The image `inferlab list-engines`, the dry run and scripts/gpu_compare.sh name (tests/adapters/test_versions.py
# keeps them in step).
IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7"
# TGI's Prometheus names, v3.3.7 router (router/src/server.rs, backends/v3/src/{lib,backend,queue}.rs). No TTFT and
# no ITL histogram; `tgi_request_mean_time_per_token_duration` is inference time / generated
# tokens (prefill included), not TPOT, so it is not mapped. `tgi_batch_current_max_tokens` is
# the tokens the running batch reserves against `tgi_batch_max_total_tokens` (TGI budgets
# every request's max_new_tokens up front), used here as the KV tokens in use. No prefix-cache
# counter at all. Speculation (--speculate): `tgi_request_skipped_tokens` is a histogram with one
# sample per request per generation step, the tokens beyond the first that step emitted, so its
# _sum is the accepted draft tokens; drafts proposed are not exported (every decode step proposes
# `speculate` tokens), so no acceptance rate can be read from TGI's own metrics.
TGI = MetricNames(
    engine="tgi",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    e2e="tgi_request_duration",
    queue_time="tgi_request_queue_duration",  # router/src/server.rs @ v3.3.7 (fixtures/tgi/facts.json metrics)
    prompt_tokens=("tgi_request_input_length_sum",),
    generation_tokens=("tgi_request_generated_tokens_sum",),
    spec_accepted_tokens=("tgi_request_skipped_tokens_sum",),
    kv_capacity=("tgi_batch_max_total_tokens",),
    kv_used=("tgi_batch_current_max_tokens",),
)

FALLBACK_DTYPE = "bfloat16"  # what a float32 config runs with
DTYPES = ("float16", "bfloat16")  # the launcher's --dtype choices
MAX_BATCH_LOG = re.compile(r"Setting max batch total tokens to (\d+)")
NO_DRAFT_MODEL = ("TGI has no draft-model speculation (--speculate uses Medusa or MLP-speculator heads shipped in "
                  "the model folder, else n-gram): the server runs without speculation")
NGRAM_MATCH = ("TGI's n-gram copies the tokens that followed the first earlier occurrence of the last token "
               "(a one-token match); prompt_lookup_min/max have no TGI setting")
ATTACHED = "an attached server's {} was fixed when it started"
# launch-log lines (server mode), TGI v3.3.7: launcher/src/main.rs (Args debug print),
# server/text_generation_server/models/{globals,__init__,flash_causal_lm}.py
LOG_DTYPE = re.compile(r"\bdtype: Some\(\s*(\w+),?\s*\)")
LOG_PREFIX = re.compile(r"Using prefix caching = (True|False)|Prefix caching (\w+)\b")  # shard | launcher
LOG_SPECULATION = re.compile(r"Using speculation ([\w-]+) with (\d+) input ids")
LOG_BLOCKS = re.compile(r"KV-cache blocks: (\d+), size: (\d+)")
LOG_GRAPHS = re.compile(r"Cuda Graphs are enabled for sizes (\[[\d, ]*\])")
LOG_MODEL_LOADED = re.compile(r"KV-cache blocks: |Setting max batch total tokens")  # the shard got past model setup
DTYPE_NAMES = {"Float16": "float16", "BFloat16": "bfloat16"}
LOG_PROMETHEUS_PORT = re.compile(r"\bprometheus_port: (\d+)")
# the launcher's resolved shard count (find_num_shards: --num-shard, else the visible GPUs), logged when > 1
LOG_SHARDS = re.compile(r"Sharding model on (\d+) processes")
LAUNCHER_VERSION = re.compile(r"text-generation-launcher (\S+)")
# 2.0.3: the recorded router log and stream; 3.3.x: the source of each tag (fixtures/tgi/SOURCE.md)
# What each release's server reports (/info `version`, `--version`): CARGO_PKG_VERSION, Cargo.toml's
# at its tag; v2.0.3 and v3.3.6/v3.3.7 shipped without bumping it (adapters/engines/tgi/upstream.json `tags`)
COMMITS = {"2.0.3": "40213c957f360bbfa740b27d67d1693e64b94102", "3.3.6": "efb94e0d3db6aba9d464bc9a2f83191146203152",
           "3.3.7": "dfb3fbe78e0d1d69251bd33065591c61bafdfaa8"}  # /info `sha` = the tag's commit (image build arg)
REPORTS = {"2.0.2": "2.0.2", "2.0.3": "2.0.2", **{f"3.3.{i}": f"3.3.{i}" for i in range(6)},
           "3.3.6": "3.3.6-dev0", "3.3.7": "3.3.6-dev0"}
VERSIONS = VersionTable("tgi", (Row("2.0.3", "2.0.3", ("2.0.3",), {"metrics": TGI}),
                                Row("3.3.0", "3.3.7", tuple(f"3.3.{i}" for i in range(8)), {"metrics": TGI})),
                        REPORTS, COMMITS)


def log_read_back(rb: ReadBack, text: str, source: str) -> None:
    """Settings from a TGI launch log (the lines listed in the module docstring)."""
    def last(pattern: re.Pattern) -> re.Match | None:
        found = list(pattern.finditer(text))
        return found[-1] if found else None

    if m := last(LOG_DTYPE):  # the launcher echoes the --dtype it was given
        rb.put("dtype", DTYPE_NAMES.get(m.group(1), m.group(1).lower()),
               f"{AS_REQUESTED} ({source}: the launcher's Args print, the --dtype it was given)")
    if m := last(LOG_SHARDS):
        rb.put("tensor_parallel_size", int(m.group(1)), source + ": Sharding model on N processes line")
    elif LOG_MODEL_LOADED.search(text):
        rb.put("tensor_parallel_size", 1, source + ": no 'Sharding model' line before the model was set up (one shard)")
    if m := last(LOG_PREFIX):
        rb.put("prefix_caching", (m.group(1) or m.group(2)).lower() in ("true", "1"), source + ": prefix caching line")
    if m := last(LOG_BLOCKS):
        rb.put("kv_blocks", int(m.group(1)), source + ": KV-cache blocks line")
        rb.put("block_size", int(m.group(2)), source + ": KV-cache blocks line")
    if m := last(LOG_GRAPHS):
        rb.put("cuda_graphs", m.group(1) != "[]", source + ": Cuda Graphs are enabled line")
    rb.put("kv_capacity_tokens", max_batch_total_tokens(text), source + ": Setting max batch total tokens")
    if m := last(LOG_SPECULATION):
        method = "ngram" if m.group(1) == "n-gram" else m.group(1)
        rb.put("speculative", {"method": method, "num_speculative_tokens": int(m.group(2))},
               source + ": Using speculation line")
    elif LOG_MODEL_LOADED.search(text):
        rb.put("speculative", False, source + ": no 'Using speculation' line before the model was set up")


def unhonoured_features(options: dict[str, Any], attached: bool) -> dict[str, str]:
    """What TGI cannot do of the uniform features asked (before any read-back)."""
    out: dict[str, str] = {}
    spec = features.speculative("tgi", options.get("speculative_config"))
    if spec is not None and spec["method"] == "draft_model":
        out["speculative_config"] = NO_DRAFT_MODEL
    elif spec is not None:
        out["speculative_config.prompt_lookup"] = NGRAM_MATCH
    if attached:
        for k in features.OPTIONS & set(options):
            out.setdefault(k, ATTACHED.format(k))
    return out


def max_batch_total_tokens(log_text: str) -> int | None:
    """N from TGI's startup line "Setting max batch total tokens to N" (the last one)."""
    found = MAX_BATCH_LOG.findall(log_text)
    return int(found[-1]) if found else None


def launch_dtype(dtype: str) -> str:
    """The --dtype a TGI server is launched with for the config's dtype."""
    return dtype if dtype in DTYPES else FALLBACK_DTYPE
