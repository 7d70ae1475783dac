"""`inferlab report RUN_DIR [RUN_DIR ...]`: rebuild a run's report from its folder, or merge several
runs into one comparison (experiments/report/build.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from experiments.commands.run import Parser, fail


def main(argv: list[str]) -> int:
    p = Parser(prog="inferlab report", description="rebuild a run's report, or merge runs into one comparison")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", help="where to write the merged report (default: the run folder itself, for one run; "
                                 "results/merged for several)")
    a = p.parse_args(argv)
    dirs = [Path(d) for d in a.run_dirs]
    if len(dirs) == 1 and (dirs[0] / "matrix.json").is_file():  # a matrix's root: its page, from its cells' folders
        from experiments.report import matrix
        from experiments.workload.config import Config

        whole = Config.model_validate(json.loads((dirs[0] / "matrix.json").read_text()))
        page = matrix.build(dirs[0], whole, command="inferlab report " + " ".join(argv))
        print(f"inferlab: matrix report written to {page}", file=sys.stderr)
        return 0
    for d in dirs:
        if not (d / "config.json").is_file():
            return fail(f"{d} is not a run folder (no config.json; a matrix's root has matrix.json)")
    out = Path(a.out) if a.out else (dirs[0] if len(dirs) == 1 else Path("results/merged"))
    from experiments.report import build

    print(f"inferlab: report written to {build(dirs, out)}", file=sys.stderr)
    return 0
