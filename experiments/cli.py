"""`inferlab` — one console script; each subcommand lives with the code it drives.

Subcommands are imported lazily so that `inferlab list-engines` works without
torch being imported, and a missing optional package fails only its command.
"""
from __future__ import annotations

import importlib
import sys

# name -> ("module:function", one-line help). The function takes argv (list[str]) and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "make-model": ("reference_engine.model.make:main", "write a random-weight HF-format model + tokenizer"),
    "serve": ("reference_engine.server.cli:main", "serve the reference engine over OpenAI + TGI HTTP routes"),
    "run": ("experiments.commands.run:run_main", "run an experiment config and write results/<name>/report.md"),
    "report": ("experiments.commands.report:main", "rebuild or merge reports from run folders"),
    "check-observer": ("experiments.commands.check_observer:main", "run one level with the harness and with a bare client, "
                                                         "beside the engine's own view: does the harness disturb it?"),
    "simulate": ("experiments.simulate.cli:main", "predict a run in simulated time (the real scheduler, a fitted "
                                                  "step-time model); --calibrate; --capacity planning"),
    "trace": ("reference_engine.engine.trace:main", "run the reference engine step by step and show each step's state"),
    "list-engines": ("experiments.commands.list_engines:main", "each registered engine: can it run here, its version, the command that installs or starts it"),
}


def _usage() -> str:
    lines = ["usage: inferlab COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<14} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"inferlab: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    target, _ = COMMANDS[name]
    module, func = target.split(":")
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
