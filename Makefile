# The two commands a new user types: `make demo` (set up + run the quickstart comparison) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-fast vllm sglang clean

$(BIN)/inferlab: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	@# the reference engine's C++ CPU attention kernel, built once here (about 30 s) rather than
	@# inside the first engine start; without a compiler the PyTorch backend serves instead
	$(BIN)/python -c "from reference_engine import cpu_attention as c; print('CPU attention kernel:', 'built' if c.available() else 'not built, the PyTorch backend serves')"
	@touch $@

setup: $(BIN)/inferlab

# vLLM's CPU build in a venv of its own (its pinned dependencies differ from ours).
vllm:
	bash scripts/setup_vllm_venv.sh

# SGLang's own Python code without its GPU dependencies, for the SGLang adapter's contract tests.
sglang:
	bash scripts/setup_sglang_venv.sh

# The quickstart compares against a real peer: vLLM's CPU build is set up first (1-2 minutes,
# with a progress line), then reference, HF baseline and vLLM run side by side.
demo: setup vllm
	$(BIN)/inferlab run experiments/configs/quickstart.toml

# One torch thread per process in tests: servers and clients share 2 cores, and spinning
# OpenMP threads of one process slow the others by an order of magnitude.
test: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/pytest -q -rs

test-fast: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/pytest -q -m "not slow"

clean:
	rm -rf $(VENV) .venv-vllm models .pytest_cache
