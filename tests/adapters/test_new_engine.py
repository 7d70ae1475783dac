"""Adding an engine is one folder under adapters/engines/ and the one registration line in it: a copy of the
adapters package gains a planted engine (an EngineSpec, a minimal server adapter, `register(...)`), and the
real commands, run as a user runs them, take it with no other file touched: `inferlab list-engines` lists it
from its spec, and `inferlab run --dry-run` builds it, plans its launch and checks its bodies."""
from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PLANTED = '''"""A planted engine: an OpenAI-compatible server launched as `planted-serve MODEL --port P`."""
from adapters.registry import EngineSpec, register
from adapters.transport.openai import OpenAIEngine
from adapters.transport.server import LaunchedServer


class PlantedServer(LaunchedServer, OpenAIEngine):
    OPTIONS = OpenAIEngine.OPTIONS | LaunchedServer.OPTIONS | {"max_model_len"}
    INSTALL = "pip install planted-engine"

    def server_argv(self):
        s = self.server
        return s.argv(script="planted-serve", args=[s.model_arg, "--port", s.port])


SPEC = EngineSpec(name="planted", block_option="block_size", block_size=32, packages=("planted-engine",),
                  script="planted-serve", probe=("http://127.0.0.1:1", "/health"),
                  install="pip install planted-engine", start="planted-serve models/tiny", colour="tab:olive")
register(SPEC, PlantedServer)
'''


def copy_with_planted_engine(dst: Path) -> Path:
    """The three packages as a user's checkout has them, adapters/ copied (so a folder can be added to it),
    the others linked; then the planted engine's folder."""
    shutil.copytree(REPO / "adapters", dst / "adapters", ignore=shutil.ignore_patterns("__pycache__"))
    for pkg in ("experiments", "reference_engine"):
        (dst / pkg).symlink_to(REPO / pkg)
    folder = dst / "adapters" / "engines" / "planted"
    folder.mkdir()
    (folder / "__init__.py").write_text(PLANTED)
    return folder


def inferlab(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd)}  # the copy's packages, ahead of the installed checkout
    return subprocess.run([sys.executable, "-m", "experiments.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_planted_engine_folder_is_listed_and_dry_run_with_no_other_edit(tmp_path, tiny_llama):
    folder = copy_with_planted_engine(tmp_path)
    # nothing outside the new folder differs from the repository's adapters package
    cmp = filecmp.dircmp(REPO / "adapters", tmp_path / "adapters", ignore=["__pycache__"])

    def changed(c: filecmp.dircmp, at: Path) -> list[str]:
        out = [str(at / f) for f in c.diff_files + c.left_only + c.right_only]
        return out + [p for name, sub in c.subdirs.items() for p in changed(sub, at / name)]

    assert changed(cmp, Path("adapters")) == [str(folder.relative_to(tmp_path))]

    listed = inferlab(tmp_path, "list-engines")
    assert listed.returncode == 0, listed.stderr[-2000:]
    lines = listed.stdout.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("planted "))
    assert lines[i] == "planted    can run here: no: not installed"
    assert "server none answering at http://127.0.0.1:1" in lines[i + 1]
    assert lines[i + 2].strip() == "$ pip install planted-engine"

    config = tmp_path / "planted.toml"
    config.write_text(f'name = "planted"\nmodel = "{tiny_llama}"\nengine = "planted"\n'
                      '[workload]\nkind = "random"\nnum_requests = 2\ninput_len = 40\noutput_len = 8\n'
                      '[load]\nmode = "closed"\nconcurrency = [1]\n')
    dry = inferlab(tmp_path, "run", str(config), "--dry-run")
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    out = dry.stdout
    assert "== planted (planted, mode server)" in out
    assert "note: 'planted-serve' is not installed here" in out
    launch = next(line for line in out.splitlines() if line.startswith("launch: "))
    assert launch.startswith(f"launch: planted-serve {tiny_llama} --port ")
    assert '"prompt": [' in out and '"max_tokens": 8' in out  # the first body, built by the adapter's own code
    assert "check not checked: planted: launch and bodies" in out  # no contract in its spec: said, not failed
    assert not (tmp_path / "results").exists()  # a dry run starts and writes nothing
