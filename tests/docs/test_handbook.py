"""The handbook: chapters in course order, each with a diagram, a worked number, code links and a lab;
every mermaid block parses, every link resolves, the measured tables match their sources, and every
lab and every command marked runnable runs against the tiny model."""
from __future__ import annotations

import re
import runpy
import subprocess
import sys

import pytest

from tests.docs import handbook as hb
from tests.docs.mermaid_check import check

ORDER = ["tokenization", "prefill", "gpu-and-roofline", "decode", "attention-kernel", "kv-cache", "sampling",
         "request-state", "scheduling", "continuous-batching", "paged-memory", "prefix-caching", "speculative-decoding",
         "serving-engine", "measuring-inference", "parallelism", "quantization", "disaggregated-serving",
         "mixture-of-experts", "kv-cache-tiers", "engines-compared"]


def test_chapters_exist_in_course_order_and_the_index_lists_them():
    assert [c.stem.split("-", 1)[1] for c in hb.CHAPTERS] == ORDER
    assert [c.stem[:2] for c in hb.CHAPTERS] == [f"{i:02d}" for i in range(1, len(ORDER) + 1)]
    index = [h for h in hb.links(hb.HANDBOOK / "README.md") if re.fullmatch(r"\d\d-[\w-]+\.md", h)]
    assert index == [c.name for c in hb.CHAPTERS]


@pytest.mark.parametrize("chapter", hb.CHAPTERS, ids=lambda p: p.stem)
def test_each_chapter_has_diagram_worked_number_code_links_and_lab(chapter):
    text = chapter.read_text()
    assert hb.fences(chapter, "mermaid"), "no mermaid diagram"
    worked = re.search(r"^## Worked number\n(.*?)(?=^## )", text, re.S | re.M)
    assert worked and re.search(r"\d", worked.group(1)), "no '## Worked number' section with a number"
    code = [h for h in hb.links(chapter) if re.search(r"\.py#\w", h)]
    assert code, "no link to a module and symbol"
    assert "## Lab" in text and hb.fences(chapter, hb.RUNNABLE), "no lab section with a runnable block"
    num = chapter.stem[:2]
    labs = [a[1] for a in hb.commands(chapter) if a[0] == "python" and "/labs/" in a[1]]
    assert any(re.search(rf"labs/{num}_\w+\.py$", lab) for lab in labs), f"chapter runs no labs/{num}_*.py"


def test_every_lab_is_run_by_a_runnable_command():
    run = {argv[1] for _, argv in hb.all_commands() if argv[0] == "python"}
    labs = {f"docs/handbook/labs/{p.name}" for p in hb.LABS.glob("*.py")}
    assert labs and labs <= run, f"labs no runnable command runs: {sorted(labs - run)}"
    numbers = {c.stem[:2] for c in hb.CHAPTERS}
    assert {p.name[:2] for p in hb.LABS.glob("*.py")} == numbers, "every chapter has a lab, every lab a chapter"


@pytest.mark.parametrize("page", hb.PAGES, ids=lambda p: p.stem)
def test_mermaid_blocks_parse(page):
    for block in hb.fences(page, "mermaid"):
        assert check(block) == [], block


@pytest.mark.parametrize("page", hb.PAGES, ids=lambda p: p.stem)
def test_links_resolve(page):
    problems = [p for href in hb.links(page) if (p := hb.resolve(page, href))]
    assert not problems, problems


RECORD = re.compile(r"((?:docs/perf|results)/[\w./-]+\.md)")
MEASURED = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s?(?:ms|µs|us|s|×|x|%|req/s|GB/s|tok/s|tokens/s|MiB|GiB|MB|GB)(?!\w)")
# numbers beside a record that are not measurements: (chapter, number) -> why
NOT_MEASURED = {("09-scheduling.md", "150"): "arithmetic: 1.5e14 FLOPs at the H200's ~989 TFLOPS, in the worked number"}


@pytest.mark.parametrize("chapter", hb.CHAPTERS, ids=lambda p: p.stem)
def test_a_paragraph_that_cites_a_record_quotes_it(chapter):
    """A paragraph naming a saved record (docs/perf/*.md, results/*/report.md) states only numbers that record
    holds, or the chapter's own tables (which build_tables.py checks against their sources): a measurement
    described in prose is a quote of a saved output, never a memory of a run."""
    text = chapter.read_text()
    tables = " ".join(re.findall(r"<!-- table: .*?<!-- /table: [\w-]+ -->", text, re.S))
    prose = re.sub(r"<!-- table: .*?<!-- /table: [\w-]+ -->", "", text, flags=re.S)
    problems = []
    for para in re.split(r"\n\s*\n", prose):
        refs = set(RECORD.findall(para))
        if not refs:
            continue
        held = tables + " ".join((hb.REPO / r).read_text() for r in refs if (hb.REPO / r).is_file())
        for n in MEASURED.findall(" ".join(para.split())):
            if n not in held and (chapter.name, n) not in NOT_MEASURED:
                problems.append(f"{n} (beside {sorted(refs)})")
    assert not problems, problems


def test_readme_links_the_first_chapter():
    assert "docs/handbook/01-tokenization.md" in hb.links(hb.REPO / "README.md")


def test_tables_are_up_to_date_with_their_sources(capsys):
    mod = runpy.run_path(str(hb.HANDBOOK / "build_tables.py"))
    assert mod["main"](["--check"]) == 0, capsys.readouterr().out
    used = {n for c in hb.CHAPTERS for n in mod["regions"](c)}
    assert used == set(mod["TABLES"]), "a table is defined but placed nowhere, or the reverse"


def test_table_selection_and_missing_sources(tmp_path):
    mod = runpy.run_path(str(hb.HANDBOOK / "build_tables.py"))
    text = "# r\n\n## Throughput\n\n| level | metric | a |\n|---|---|---|\n| c=1 | output tokens/s | 5 |\n" \
           "| c=1 | wall time (s) | 2 |\n\n## Other\n\n| x |\n|---|\n| 1 |\n"
    spec = mod["Table"]("unused", section="Throughput", rows="tokens/s", columns=("metric", "a"))
    assert mod["select"](spec, text) == [["metric", "a"], ["output tokens/s", "5"]]
    with pytest.raises(LookupError):
        mod["select"](mod["Table"]("unused", section="Latency"), text)
    # a section is its heading, or the heading with a note in brackets, never a longer heading
    text2 = "## Memory split\n\n| engine | peak |\n|---|---|\n| a | 9 |\n\n## Memory (sampled)\n\n" \
            "| level | metric | a |\n|---|---|---|\n| c=1 | peak RSS (MiB) | 7 |\n"
    assert mod["select"](mod["Table"]("unused", section="Memory", rows="peak RSS"), text2)[1] == ["c=1", "peak RSS (MiB)", "7"]
    with pytest.raises(LookupError, match="no row matching"):  # rows that keep nothing: a broken selector
        mod["select"](mod["Table"]("unused", section="Throughput", rows="TTFT"), text)
    mod["TABLES"]["x"] = mod["Table"]("results/none/report.md", section="Throughput", optional=True)
    assert "Not measured yet" in mod["render"]("x", hb.CHAPTERS[0])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_llama, smollm2):
    """A working directory where `models/tiny-llama` (the labs' and the trace's default) is the tiny model
    and `models/smollm2-135m-instruct` (the real-model labs' default) is SmolLM2-135M-Instruct."""
    d = tmp_path_factory.mktemp("handbook-cwd")
    (d / "models").mkdir()
    (d / "models" / "tiny-llama").symlink_to(tiny_llama)
    (d / "models" / "smollm2-135m-instruct").symlink_to(smollm2)
    return d


def run_in_process(argv: list[str]) -> int:
    """Run a handbook command in this interpreter (one torch import for all of them): the same argv."""
    if argv[0] == "python":
        script = hb.REPO / argv[1]
        saved = sys.argv
        sys.argv = [str(script), *argv[2:]]
        try:
            runpy.run_path(str(script), run_name="__main__")
            return 0
        except SystemExit as e:
            return int(e.code or 0)
        finally:
            sys.argv = saved
    if argv[0] == "inferlab":
        from experiments.cli import main
        return main(argv[1:])
    raise AssertionError(f"runnable commands are 'python docs/handbook/...' or 'inferlab ...', got {argv}")


OUTPUTS: dict[tuple[str, ...], str] = {}  # argv -> stdout; the module is one xdist group, so one cache


def output(argv: list[str], workdir, monkeypatch, capsys) -> str:
    """A runnable command's stdout, run once per session (the quote checks reuse the run's output)."""
    key = tuple(argv)
    if key not in OUTPUTS:
        monkeypatch.chdir(workdir)
        monkeypatch.setenv("COLUMNS", "160")
        capsys.readouterr()
        rc = run_in_process(argv)
        out = capsys.readouterr()
        assert rc == 0, f"{' '.join(argv)} exited {rc}\n{out.out[-2000:]}\n{out.err[-2000:]}"
        OUTPUTS[key] = out.out
    return OUTPUTS[key]


@pytest.mark.slow
@pytest.mark.parametrize("page,argv", hb.all_commands(), ids=lambda x: x if isinstance(x, str) else " ".join(x)[:60])
def test_runnable_command_runs(page, argv, workdir, monkeypatch, capsys):
    assert output(argv, workdir, monkeypatch, capsys).strip(), f"{page}: printed nothing"


@pytest.mark.slow
def test_a_lab_runs_as_a_script_from_the_repository(tiny_llama):
    """The labs are plain scripts: `python docs/handbook/labs/NN.py --model DIR` from the repo root."""
    r = subprocess.run([sys.executable, "docs/handbook/labs/06_kv_cache.py", "--model", str(tiny_llama)],
                       cwd=hb.REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "131,072 B/token" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("chapter", hb.CHAPTERS, ids=lambda p: p.stem)
def test_numbers_a_chapter_quotes_match_its_lab(chapter, workdir, monkeypatch, capsys):
    """Every lab runs, and what its chapter quotes from it is what it printed (tests/docs/lab_quotes.py)."""
    from tests.docs.lab_quotes import CHECKS

    check = CHECKS[chapter.stem[:2]]
    runnable = {" ".join(argv) for argv in hb.commands(chapter)}

    def run(command: str) -> str:
        assert command in runnable, f"{command!r} is not a runnable command of {chapter.name}"
        return output(command.split(), workdir, monkeypatch, capsys)

    check(run, " ".join(chapter.read_text().split()))


def test_every_chapter_has_a_quote_check():
    from tests.docs.lab_quotes import CHECKS

    assert sorted(CHECKS) == [c.stem[:2] for c in hb.CHAPTERS]
