#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the source vendored in the llama-cpp-python sdist (PyPI), for the
# llama.cpp adapter (adapters/engines/llamacpp). Only the server target is built, for this host's ISA
# (GGML_NATIVE), statically linked. The binary is cached under ~/.cache/inferlab/llamacpp/ keyed by the
# sdist's version, the llama.cpp commit it carries and the compiler's resolved -march=native flags: a warm
# setup is a copy, a cold one (about 5 minutes on 2 cores) runs only on a cache miss.
# Result: .llamacpp/bin/llama-server and .llamacpp/src (the source: convert_hf_to_gguf.py, gguf-py).
# Usage: scripts/setup_llamacpp.sh [OUT_DIR]     (env INFERLAB_CACHE moves the cache)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.llamacpp}"
SDIST_VERSION=0.3.36         # llama-cpp-python; its CHANGELOG names the llama.cpp commit it vendors
COMMIT=0c1e57098             # "update llama.cpp to ggml-org/llama.cpp@0c1e57098" (CHANGELOG.md, 0.3.36)
BUILD=11312                  # llama.cpp's release b11312 is that commit (its server image: server-b11312)
CACHE="${INFERLAB_CACHE:-$HOME/.cache/inferlab}/llamacpp"
PY="${PYTHON:-python3}"

# The ISA key: what -march=native resolves to here (another CPU model builds its own binary).
cc1=$(echo | cc -march=native -E -v - 2>&1)
native=$(grep '/cc1 ' <<<"$cc1")
isa=$(grep -o -- ' -m[a-z0-9=.-]*' <<<"$native" | sort | sha256sum | cut -c1-12)
arch=$(grep -o -- ' -march=[^ ]*' <<<"$native" | cut -d= -f2)
key="$SDIST_VERSION-b$BUILD-$COMMIT-$arch-$isa"
src="$CACHE/src-$SDIST_VERSION"
bin="$CACHE/$key/llama-server"

if [ ! -f "$src/.complete" ]; then
  echo "llamacpp: fetching llama-cpp-python $SDIST_VERSION (sdist, ~75 MB) for its vendored llama.cpp"
  tmp=$(mktemp -d)
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$SDIST_VERSION" -d "$tmp"
  tar -xzf "$tmp"/llama_cpp_python-"$SDIST_VERSION".tar.gz -C "$tmp"
  grep -q "llama.cpp@$COMMIT" "$tmp/llama_cpp_python-$SDIST_VERSION/CHANGELOG.md" \
    || { echo "llamacpp: the sdist's CHANGELOG does not name commit $COMMIT" >&2; exit 1; }
  rm -rf "$src" && mkdir -p "$CACHE"
  mv "$tmp/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp" "$src"
  rm -f "$src/.git"  # a submodule pointer to a gitdir the sdist lacks: the commit comes from -D below
  rm -rf "$tmp"
  touch "$src/.complete"
fi

if [ ! -x "$bin" ]; then
  echo "llamacpp: building llama-server $COMMIT for -march=$arch (cache miss: $key; about 5 min on 2 cores)"
  start=$SECONDS
  build=$(mktemp -d)
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_COMMIT="$COMMIT" -DLLAMA_BUILD_NUMBER="$BUILD" > "$build/configure.log" 2>&1 \
    || { tail -30 "$build/configure.log" >&2; exit 1; }
  cmake --build "$build" --target llama-server -j "$(nproc)" > "$build/build.log" 2>&1 \
    || { tail -30 "$build/build.log" >&2; exit 1; }
  mkdir -p "$(dirname "$bin")"
  cp "$build/bin/llama-server" "$bin.tmp" && mv "$bin.tmp" "$bin"
  rm -rf "$build"
  echo "llamacpp: built in $((SECONDS - start)) s"
fi

mkdir -p "$OUT/bin"
cp "$bin" "$OUT/bin/llama-server.tmp" && mv "$OUT/bin/llama-server.tmp" "$OUT/bin/llama-server"
ln -sfn "$src" "$OUT/src"
"$OUT/bin/llama-server" --version 2>&1 | grep -m1 version
