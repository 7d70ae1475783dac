"""How adapters reach an engine's server: launch it (launcher.py, server.py), stream from it (sse.py,
openai.py: the OpenAI protocol client several engines share, deltas.py), read its Prometheus text
(prom.py, metric_names.py)."""
