"""The soak benchmark's parts (`make soak`, driven by `python -m experiments.soak`: __main__.py): hours of
mixed traffic against one `inferlab serve`, judged on what must not drift.

- `mix`: what is sent, one request at a time from a shuffled deck (chat, multi-turn conversations
  sharing their history, prompts filling the context to `max_model_len`, streams cut mid-way,
  invalid requests, n > 1, logprobs) and the fixed greedy probe set;
- `client`: one request over aiohttp, its stream timestamped as the harness does (`recv_ns`
  when a line arrives), returned as a record `experiments.measuring.metrics.per_request` reads;
- `load`: open-loop Poisson arrivals of the mix, one latency window's replayed every window (the
  drift verdict compares the same arrivals), and the SLO search over it (the harness's own
  bracketing and bisection, `experiments.running.search`);
- `observe`: every `sample_s`, the server tree's RSS, KV blocks in use from /metrics and the
  latency of the requests that finished since the last sample;
- `verdict`: the verdict lines, `report`: the markdown page and its plot.

It owns no server code: it speaks HTTP to a server it is given, and reads the server's
process tree only through psutil.
"""
