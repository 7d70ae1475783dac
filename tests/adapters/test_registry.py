"""Every engine folder registers itself: each name resolves to adapter classes whose import pulls in no
engine package, the mode its options ask for picks the class, and start() either works or fails with one
line saying what to install."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adapters import registry
from adapters.base import Engine
from adapters.engines.llamacpp import settings as llamacpp_settings
from adapters.engines.vllm.adapter import VLLMInProcess, VLLMServer

HEAVY = ("torch", "transformers", "vllm", "sglang", "tensorrt_llm")
REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, cwd: Path | None = None, timeout: int = 300) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=timeout, cwd=cwd, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError) as err:
        registry.create("vllmm", "/m")
    assert "unknown engine 'vllmm'" in str(err.value)
    assert all(name in str(err.value) for name in registry.names())


def test_importing_every_adapter_imports_no_engine_package():
    out = run_python(f"""
        import json, sys
        from adapters import registry
        classes = {{name: [c.__name__ for c in registry.entry(name).modes.values()] for name in registry.names()}}
        print(json.dumps([classes, [m for m in {HEAVY!r} if m in sys.modules]]))
    """)
    classes, heavy = json.loads(out)
    assert set(classes) == set(registry.names()) and heavy == []


@pytest.fixture(scope="module")
def outcomes(tiny_llama, tmp_path_factory):
    """Each adapter constructed with default options and started, in an interpreter where
    transformers, vLLM, SGLang and TensorRT-LLM cannot be imported, run outside the repo (so
    no ./.venv-vllm is found as a default launcher): name -> [outcome, message]."""
    blocked = [m for m in HEAVY if m != "torch"]
    out = run_python(f"""
        import asyncio, json, sys
        for m in {blocked!r}:
            sys.modules[m] = None  # as if the package were not installed
        from adapters import registry
        from adapters.base import EngineUnavailable

        async def one(name):
            # TensorRT-LLM refuses float32 at construction (its kernels run bfloat16 / float16)
            engine = registry.create(name, {str(tiny_llama)!r}, "bfloat16" if name == "trtllm" else "float32", {{}})
            try:
                await engine.start()
            except EngineUnavailable as e:
                return ["unavailable", str(e)]
            except ValueError as e:
                return ["config", str(e)]
            await engine.stop()
            return ["started", ""]

        def outcome(name):
            try:
                return asyncio.run(one(name))
            except Exception as e:  # reported per name, so one broken adapter fails only its test
                return ["error", repr(e)]

        print(json.dumps({{name: outcome(name) for name in registry.names()}}))
    """, cwd=tmp_path_factory.mktemp("elsewhere"))
    return json.loads(out)


@pytest.mark.parametrize("name", registry.names())
def test_start_works_or_names_what_to_install(outcomes, name):
    kind, message = outcomes[name]
    # llama.cpp, where make llamacpp built it, starts and refuses the tiny model: its converter knows no such tokenizer
    built = name == "llamacpp" and llamacpp_settings.binary() is not None
    expected = {"reference": "started", "openai": "config"}.get(name, "config" if built else "unavailable")
    assert kind == expected, (name, kind, message)
    if kind == "unavailable":
        assert "install" in message and "\n" not in message.strip(), message
    if name == "hf":
        assert "pip install 'inferlab[hf]'" in message
    if name == "openai":
        assert "needs option url" in message
    if built:
        assert "convert_hf_to_gguf.py could not convert" in message and "pre-tokenizer" in message, message


def test_every_adapter_is_an_engine_of_its_own_folder():
    for name in registry.names():
        e = registry.entry(name)
        assert e.spec.name == name and e.spec.default_mode in e.modes, name
        for mode, cls in e.modes.items():
            assert issubclass(cls, Engine) and cls.name == name and cls.spec is e.spec and mode in cls.MODES, (name, mode)
            assert cls.__module__.startswith(f"adapters.engines.{name}.") or name == "openai", cls.__module__
        assert len(set(e.modes.values())) <= 2, f"{name}: a server engine is at most two classes"


def test_the_mode_picks_the_class_and_a_wrong_one_is_one_line():
    assert type(registry.create("vllm", "/m")) is VLLMServer and registry.create("vllm", "/m").mode == "server"
    attached = registry.create("vllm", "/m", options={"url": "http://127.0.0.1:9"})
    assert type(attached) is VLLMServer and attached.mode == "attach"
    assert type(registry.create("vllm", "/m", options={"mode": "in_process"})) is VLLMInProcess
    with pytest.raises(ValueError, match=r"engine 'vllm': mode must be one of server, attach, in_process, got 'x'"):
        registry.create("vllm", "/m", options={"mode": "x"})
    with pytest.raises(ValueError, match=r"option\(s\) launcher need mode = \"server\""):
        registry.create("vllm", "/m", options={"mode": "in_process", "launcher": ".venv-vllm"})
    with pytest.raises(ValueError, match="mode must be one of server, attach, got 'in_process'"):
        registry.create("tgi", "/m", "float16", {"mode": "in_process"})
    assert registry.target(registry.create("vllm", "/m", options={"mode": "in_process"})) == \
        "adapters.engines.vllm.adapter:VLLMInProcess"  # what a child process imports to build it again
