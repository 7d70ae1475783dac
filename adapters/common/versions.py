"""Version tables (each peer engine's lives in its folder: SGLang, TensorRT-LLM, TGI): which launch flags and
metric names an adapter uses for the engine version it finds, and the versions each row
was checked against (cited in tests/adapters/fixtures/<engine>/SOURCE.md).

An adapter finds the version before it launches (the launcher's installed package, or the
tag of a container image) and again from the running server (its /server_info, /version or
/info); a version no row covers is refused with one line naming the rows that are known,
because flags and metric names that were never checked against it may be wrong silently.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from typing import Any

from adapters.base import EngineUnavailable

_PART = re.compile(r"(\d+)|([a-z]+)")
_PRE = {"a": -3, "alpha": -3, "b": -2, "beta": -2, "rc": -1}  # before the release they lead to


def parse(version: str) -> tuple[int, ...] | None:
    """'0.5.23' -> (0, 5, 23, 0, 0); '1.3.0rc24' -> (1, 3, 0, -1, 24); 'v3.3.7' -> (3, 3, 7, 0, 0).
    A dev or local build ('0.0.0.dev1+g54b06f', '3.3.7-dev0') or a non-version gives None:
    what such a build runs cannot be told from its number."""
    text = str(version).strip().lower().removeprefix("v")
    m = re.fullmatch(r"(\d+(?:\.\d+)*)(?:(a|alpha|b|beta|rc)\.?(\d+))?(?:\.?post\d+)?", text)
    if not m:
        return None
    nums = [int(p) for p in m.group(1).split(".")][:3]
    nums += [0] * (3 - len(nums))
    pre = (_PRE[m.group(2)], int(m.group(3))) if m.group(2) else (0, 0)
    return (*nums, *pre)


@dataclass(frozen=True)
class Row:
    low: str  # first version the row covers (inclusive)
    high: str  # last version it covers (inclusive)
    checked: tuple[str, ...]  # versions whose source (or recorded output) this row was checked against
    values: dict[str, Any] = field(default_factory=dict)  # what the adapter uses for these versions

    def covers(self, version: str) -> bool:
        v = parse(version)
        return v is not None and parse(self.low) <= v <= parse(self.high)

    def span(self) -> str:
        return self.low if self.low == self.high else f"{self.low}-{self.high}"


@dataclass(frozen=True)
class VersionTable:
    """`rows`: what the adapter uses per release. `reports`: release -> the version string that
    release's server reports (its /info, /version or `--version`), where that is not the release
    itself (TGI v3.3.7 was built from a Cargo.toml still saying "3.3.6-dev0"); recorded from
    upstream's source at each tag, neighbouring releases included so that a string two releases
    share is known to be ambiguous."""
    engine: str
    rows: tuple[Row, ...]
    reports: dict[str, str] = field(default_factory=dict)
    commits: dict[str, str] = field(default_factory=dict)  # release -> the commit its build reports (TGI /info sha)

    def release_of(self, commit: str | None) -> str | None:
        """The release built from `commit` (what a server that reports its build commit runs)."""
        return next((rel for rel, c in self.commits.items() if commit and c == commit), None)

    def known(self) -> str:
        return ", ".join(r.span() for r in self.rows)

    def reported(self, release: str) -> str:
        """What the server of `release` reports."""
        return self.reports.get(release, release)

    def releases(self, version: str) -> list[str]:
        """The releases whose server reports `version` (the string itself when none is recorded)."""
        found = [rel for rel, said in self.reports.items() if said == version]
        return found or [version]

    def _covering(self, release: str) -> Row | None:
        return next((r for r in self.rows if r.covers(release)), None)

    def _refuse(self, what: str) -> EngineUnavailable:
        return EngineUnavailable(f"{self.engine} {what} is not in the adapter's version table "
                                 f"(known: {self.known()}; adapters/engines/{self.engine}/)")

    def row(self, version: str | None, tag: str | None = None) -> Row:
        """The row for the server reporting `version`; `tag`, when known (a container image's),
        is the release itself and is trusted: a server reporting other than that release's string
        is refused. EngineUnavailable (one line) for anything no row covers or that is ambiguous."""
        if tag is not None:
            row = self._covering(tag)
            if row is None:
                raise self._refuse(f"{tag} (image tag)")
            if version is not None and version != self.reported(tag) and parse(version) != parse(tag):
                raise EngineUnavailable(f"{self.engine}: the image tag says {tag}, whose server reports "
                                        f"{self.reported(tag)!r}, but this server reports {version!r}")
            return row
        if version is None:
            raise self._refuse("(version not reported)")
        if self.reported(version) != version and version not in self.reports.values():
            raise EngineUnavailable(f"{self.engine}: no release reports {version!r} (release {version}'s server "
                                    f"reports {self.reported(version)!r}): this server is not what it says")
        releases = self.releases(version)
        rows = [self._covering(r) for r in releases]
        if None in rows and len(releases) > 1:
            raise EngineUnavailable(
                f"{self.engine} reports {version!r}, which releases {', '.join(releases)} all report, and not "
                f"all of them are in the adapter's version table (known: {self.known()}): launch the "
                f"container image by its release tag so that the tag decides")
        if None in rows or len(set(map(id, rows))) > 1:
            raise self._refuse(version if len(releases) == 1 else f"{version} ({', '.join(releases)})")
        return rows[0]

    def newest(self) -> Row:
        return max(self.rows, key=lambda r: parse(r.high))


def python_package_version(python: str, dist: str) -> str | None:
    """The installed version of distribution `dist` for interpreter `python` (None: not installed)."""
    code = ("import importlib.metadata as m, sys\n"
            f"try: print(m.version({dist!r}))\n"
            "except m.PackageNotFoundError: sys.exit(1)")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def image_tag_version(container_argv: list[str]) -> str | None:
    """The version in a container image tag ('lmsysorg/sglang:v0.5.23-cu129' -> '0.5.23',
    'nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24' -> '1.3.0rc24'); None for 'latest' or no tag."""
    image = container_argv[-1] if container_argv else ""
    tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
    m = re.match(r"v?(\d+\.\d+(?:\.\d+)?(?:rc\d+|\.post\d+)?)", tag)
    return m.group(1) if m else None


def launcher_version(launcher: Any, dist: str) -> str | None:
    """The engine version a launcher would run, found without starting it (None: unknown)."""
    if launcher.is_container:
        return image_tag_version(launcher.prefix)
    return python_package_version(launcher.prefix[0], dist)

