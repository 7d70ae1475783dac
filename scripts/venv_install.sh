#!/usr/bin/env bash
# Install packages into a venv (created if absent) with uv, or with pip where uv cannot be had.
# Usage: scripts/venv_install.sh VENV [pip-install arguments...]
#        scripts/venv_install.sh VENV --uninstall PACKAGE...
# Environment: PYTHON (base interpreter for a new venv, default python3); UV (a uv binary to use);
# INSTALLER=pip (use pip even where uv is available).
#
# uv downloads in parallel and links files from its cache (~/.cache/uv), so the second venv that
# needs the same torch costs seconds; pip takes minutes for the same set. uv does not read pip's
# configuration, so pip's index settings are passed on to it: index-url, extra-index-url,
# find-links, no-index, constraint, trusted-host and cert, as `pip config list` reports them
# (pip.conf files and PIP_* variables), plus `--index-strategy unsafe-best-match`, which picks the
# best version across all indexes as pip does. uv is found as $UV, in VENV, on PATH, or installed
# into VENV with pip (one small wheel). Where uv is missing or fails, pip does the install.
# No bytecode is compiled here (pip compiles every file of every package, much of its time): the
# setup steps import what their programs import once, with writing .pyc files allowed.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 VENV [pip-install arguments...] | VENV --uninstall PACKAGE..." >&2; exit 2; }
VENV="$1"; shift
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"
say() { echo "$VENV: $*"; }

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
quiet() {  # run "$@" with its output kept aside, shown only when it fails
  if "$@" >"$log" 2>&1; then return 0; fi
  cat "$log" >&2; return 1
}

have_pip() { "$PY" -m pip --version >/dev/null 2>&1; }
ensure_pip() { have_pip || quiet "$PY" -m ensurepip --upgrade; }

uv=""
find_uv() {
  [ "${INSTALLER:-}" != pip ] || return 1
  if [ -n "${UV:-}" ]; then uv="$UV"
  elif [ -x "$VENV/bin/uv" ]; then uv="$VENV/bin/uv"
  elif command -v uv >/dev/null 2>&1; then uv="$(command -v uv)"
  else
    say "installing uv with pip (a faster installer; pip does the work if this fails)"
    # The base interpreter's pip installs into the venv (pip >= 22.3), else the venv's own pip.
    quiet "$PYTHON" -m pip --python "$PY" install -q --disable-pip-version-check uv \
      || { ensure_pip && quiet "$PY" -m pip install -q --disable-pip-version-check uv; } || return 1
    uv="$VENV/bin/uv"
  fi
  "$uv" --version >/dev/null 2>&1
}

# pip's index settings as uv arguments, one a line (values with spaces are not split again).
uv_index_args() {
  "$PYTHON" - <<'PY'
import os, subprocess, sys
conf = {}
try:  # "section.key='value'" lines: files (global., install.) and environment (:env:.)
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         timeout=60).stdout
except Exception:
    out = ""
rank = {"global": 0, "install": 1, ":env:": 2}  # pip: PIP_* over [install] over [global]
best = {}
for line in out.splitlines():
    name, sep, value = line.partition("=")
    section, _, key = name.rpartition(".")
    if not sep or section not in rank:
        continue
    value = value.strip().strip("'\"")
    if rank[section] >= best.get(key, -1):
        best[key], conf[key] = rank[section], value
for key in ("index-url", "extra-index-url", "find-links", "no-index", "constraint", "trusted-host", "cert"):
    env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if env is not None:  # pip reads these itself even where `pip config` is unavailable
        conf[key] = env
args = []
if conf.get("index-url"):
    args += ["--index-url", conf["index-url"]]
for key, flag in (("extra-index-url", "--extra-index-url"), ("find-links", "--find-links"),
                  ("constraint", "--constraint"), ("trusted-host", "--allow-insecure-host")):
    for v in conf.get(key, "").split():
        args += [flag, v]
if conf.get("no-index", "").lower() in ("1", "true", "yes", "on"):
    args.append("--no-index")
if conf.get("cert"):
    args.append("CERT=" + conf["cert"])  # not a flag: uv reads SSL_CERT_FILE
print("\n".join(args))
PY
}

if [ "${1:-}" = "--uninstall" ]; then
  shift
  if find_uv; then "$uv" pip uninstall -q --python "$PY" "$@"
  else ensure_pip && "$PY" -m pip uninstall -q -y "$@"; fi
  exit 0
fi

if [ ! -x "$PY" ]; then
  if [ "${INSTALLER:-}" != pip ]; then "$PYTHON" -m venv --without-pip "$VENV"  # fast; pip comes with the packages
  else "$PYTHON" -m venv "$VENV"; fi
fi

if find_uv; then
  args=()
  cert=""
  while IFS= read -r a; do
    case "$a" in CERT=*) cert="${a#CERT=}" ;; ?*) args+=("$a") ;; esac
  done < <(uv_index_args)
  [ -z "$cert" ] || [ -n "${SSL_CERT_FILE:-}" ] || export SSL_CERT_FILE="$cert"
  # pip goes in too, so that the venv works with pip afterwards as one made by `python -m venv` does.
  if "$uv" pip install -q --python "$PY" --index-strategy unsafe-best-match ${args[@]+"${args[@]}"} pip "$@"; then
    exit 0
  fi
  say "uv failed; installing with pip instead"
fi
ensure_pip
"$PY" -m pip install -q --disable-pip-version-check "$@"
