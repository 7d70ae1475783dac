"""Helpers shared by the harness tests."""
from __future__ import annotations

import textwrap
from pathlib import Path


def write_config(path: Path, model: Path, body: str, name: str = "t") -> Path:
    """A config file: `name`, `model`, then `body` (dedented TOML)."""
    path.write_text(f'name = "{name}"\nmodel = "{model}"\n' + textwrap.dedent(body))
    return path
