"""Version tables, the pinned images, and `inferlab list-engines` (what can run here and now)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from adapters import registry
from adapters.base import EngineUnavailable
from adapters.common.versions import image_tag_version, parse
from adapters.engines.sglang.settings import VERSIONS as SGLANG
from adapters.engines.tgi.settings import VERSIONS as TGI
from adapters.engines.trtllm.adapter import VERSIONS as TRTLLM
from experiments.commands import list_engines as engines_here
from tests.adapters.replay import Replay

REPO = Path(__file__).resolve().parents[2]
TABLES = {"sglang": SGLANG, "trtllm": TRTLLM, "tgi": TGI}
IMAGES = {s.name: s.image for s in registry.specs() if s.image}  # each engine's pinned image, from its spec


def test_version_order_and_builds_that_cannot_be_told():
    assert parse("0.5.9") < parse("0.5.13") < parse("0.5.22.post1") and parse("v3.3.7") == parse("3.3.7")
    assert parse("1.3.0rc7") < parse("1.3.0rc24") < parse("1.3.0")
    assert parse("0.0.0.dev1+g54b06f199") is None and parse("latest") is None


@pytest.mark.parametrize("engine", sorted(TABLES))
def test_every_row_lists_versions_it_covers_and_rows_do_not_overlap(engine):
    rows = sorted(TABLES[engine].rows, key=lambda r: parse(r.low))
    for r in rows:
        assert r.checked and all(r.covers(v) for v in r.checked), r
    for a, b in zip(rows, rows[1:]):
        assert parse(a.high) < parse(b.low)


@pytest.mark.parametrize("engine", sorted(TABLES))
def test_pinned_images_are_versions_the_tables_cover(engine):
    TABLES[engine].row(None, tag=image_tag_version(["docker", "run", IMAGES[engine]]))


def test_gpu_compare_script_pins_the_same_images():
    text = (REPO / "scripts/gpu_compare.sh").read_text()
    pins = dict(re.findall(r'^(\w+)_IMAGE="\$\{\w+_IMAGE:-([^}]+)\}"', text, re.M))
    assert pins == {"VLLM": IMAGES["vllm"], "SGLANG": IMAGES["sglang"], "TRTLLM": IMAGES["trtllm"], "TGI": IMAGES["tgi"],
                    "LLAMACPP": IMAGES["llamacpp"]}


def test_refusal_is_one_line_naming_what_is_known():
    with pytest.raises(EngineUnavailable) as err:
        SGLANG.row("0.5.8")
    assert str(err.value) == ("sglang 0.5.8 is not in the adapter's version table (known: 0.5.9-0.5.12, 0.5.13, "
                              "0.5.14-0.5.21, 0.5.22-0.5.23; adapters/engines/sglang/)")


def test_list_engines_says_per_engine_what_runs_here_and_the_command():
    out = subprocess.run([sys.executable, "-m", "experiments.cli", "list-engines"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 * len(registry.names()) + 2 and "inferlab run CONFIG --dry-run" in lines[-1]
    for i, name in enumerate(registry.names()):
        head, facts, command = lines[3 * i: 3 * i + 3]
        assert head.startswith(f"{name:<10} can run here: ") and "GPU " in facts and command.strip().startswith("$ ")


def test_a_gpu_engine_without_a_gpu_cannot_run_and_its_image_command_is_given():
    row = engines_here.status(registry.spec("tgi"), gpu=None)
    assert row["here"].startswith("no: needs a CUDA GPU") and IMAGES["tgi"] in row["command"]
    assert row["gpu"] == "needed; here: none"


def test_sglangs_contract_venv_is_not_a_server_even_with_a_gpu():
    if not (REPO / ".venv-sglang/bin/python").exists():
        if os.environ.get("CI"):  # .ci/run installs it: its absence there is a failure, not a skip
            pytest.fail(".venv-sglang is absent although .ci/run makes it (make sglang)")
        pytest.skip(".venv-sglang is absent: run scripts/setup_sglang_venv.sh (make sglang)")
    row = engines_here.status(registry.spec("sglang"), gpu="GPU 0: NVIDIA H200")
    assert row["here"].startswith("no: .venv-sglang holds its code only") and row["version"] == "0.5.23"
    assert row["command"].startswith("docker run") and IMAGES["sglang"] in row["command"]


def test_a_server_answering_at_the_usual_address_is_reported_with_its_version():
    with Replay({("GET", "/server_info"): (200, "application/json", b'{"version": "0.5.23"}')}) as srv:
        assert engines_here.answers((srv.url, "/server_info")) == f"{srv.url} (version 0.5.23)"
    assert engines_here.answers(("http://127.0.0.1:9", "/info"), timeout_s=0.2) is None


def test_the_pinned_trtllm_tags_reported_version_maps_to_its_row():
    """What the v1.3.0rc24 server reports at GET /version (adapters/engines/trtllm/upstream.json)."""
    from adapters.checks.dryrun import facts

    said = facts("trtllm")["reported_version"]["value"]
    assert TRTLLM.row(said).covers(image_tag_version(["docker", "run", IMAGES["trtllm"]]))


def test_the_pinned_sglang_releases_reported_version_maps_to_its_row():
    """/server_info `version` is sglang's `__version__`, read here from the pinned release's own
    generated sglang/_version.py (.venv-sglang, made by .ci/run)."""
    version_py = next(REPO.glob(".venv-sglang/lib/python3*/site-packages/sglang/_version.py"), REPO / "absent")
    if not version_py.exists():
        if os.environ.get("CI"):
            pytest.fail(".venv-sglang is absent although .ci/run makes it (make sglang)")
        pytest.skip(".venv-sglang is absent: run scripts/setup_sglang_venv.sh (make sglang)")
    said = re.search(r"__version__ = version = '([^']+)'", version_py.read_text()).group(1)
    pinned = image_tag_version(["docker", "run", IMAGES["sglang"]])
    assert said == pinned and SGLANG.row(said).covers(pinned)
