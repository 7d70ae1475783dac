"""Runs in .venv-vllm (or any interpreter with vLLM), not in the harness: checks a launch command
against vLLM's own argument parser (the one `python -m vllm.entrypoints.openai.api_server` builds:
make_arg_parser + validate_parsed_serve_args, vllm/entrypoints/launchers/api_server/entry.py) and
request bodies against its own request models (CompletionRequest, ChatCompletionRequest). vLLM's
models accept unknown fields and ignore them (OpenAIBaseModel extra="allow", logged at debug
level), so an unknown field is reported too: it would be dropped silently.

stdin, one request per line: {"argv": [server args], "bodies": [[route, body], ...]}; stdout, one
line per request after REPLY: {"version", "argv": {"ok", "error"}, "bodies": [{"ok", "unknown", "error"}]}.
"""
from __future__ import annotations

import contextlib
import io
import json
import sys

REPLY = "@@inferlab-check@@"  # adapters/dryrun.run_checker reads the lines that start with it

def parse(argv: list[str]) -> dict:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            validate_parsed_serve_args(make_arg_parser(FlexibleArgumentParser(prog="vllm.entrypoints.openai.api_server")).parse_args(argv))
    except SystemExit:
        return {"ok": False, "error": (err.getvalue().strip().splitlines() or ["(no message)"])[-1]}
    except Exception as e:  # validate_parsed_serve_args raises TypeError / ValueError
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True}


def validate(route: str, body: dict) -> dict:
    import pydantic
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    model = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}.get(route)
    if model is None:
        return {"ok": False, "error": f"no vLLM request model for route {route}"}
    names = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    unknown = sorted(set(body) - names)
    try:
        model.model_validate(body)
    except pydantic.ValidationError as e:
        return {"ok": False, "unknown": unknown, "error": str(e).splitlines()[1:3]}
    return {"ok": not unknown, "unknown": unknown, "model": model.__name__}


def main() -> None:
    for line in sys.stdin:  # one request per line; vLLM is imported once for all of them
        req = json.loads(line)
        import vllm

        out = {"version": vllm.__version__, "argv": parse(req["argv"]),
               "bodies": [validate(route, body) for route, body in req.get("bodies", [])]}
        print(REPLY, json.dumps(out), flush=True)  # the marker: a log line on stdout is not a reply


if __name__ == "__main__":
    main()
