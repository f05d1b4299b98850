#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` from the tree vendored in llama-cpp-python's sdist,
# portably (no -march=native: the native build dies with "Illegal instruction" on machines
# whose CPU differs from the one that compiled it), and caches the binary under
#   ${HARNESS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/harness}/llama-server/<version>-<flags hash>/
# so a second run costs nothing. Beside it goes tool-call-template.jinja, the Hermes-2-Pro
# tool-use chat template from the same tree: SmolLM2's own template describes no tools, and this
# ChatML one (SmolLM2 speaks ChatML) lets the server constrain and parse tool calls.
# Prints the binary's path on stdout; progress goes to stderr.
# Needs cmake, a C++17 compiler and make; installs them with apt-get when missing and root.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${LLAMA_BUILD_JOBS:-2}"
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
)
FLAGS_HASH="$(printf '%s\n' "${CMAKE_FLAGS[@]}" | sha256sum | cut -c1-12)"
CACHE_ROOT="${HARNESS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/harness}"
DEST="$CACHE_ROOT/llama-server/$VERSION-$FLAGS_HASH"
BIN="$DEST/llama-server"
TEMPLATE="$DEST/tool-call-template.jinja"

if [[ -x "$BIN" && -f "$TEMPLATE" ]]; then
  echo "$BIN"
  exit 0
fi

missing=()
for tool in cmake make g++; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  if [[ "$(id -u)" != 0 ]]; then
    echo "build-llama-server: missing ${missing[*]} and not root to apt-get them" >&2
    exit 1
  fi
  echo "build-llama-server: installing cmake build-essential via apt-get" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake build-essential >&2
fi

PYTHON="${PYTHON:-python3}"
WORK="$CACHE_ROOT/llama-server/build-$VERSION-$FLAGS_HASH"
mkdir -p "$WORK"
SDIST="$WORK/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
  echo "build-llama-server: downloading the llama-cpp-python $VERSION sdist" >&2
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$WORK" >&2
fi
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [[ ! -d "$SRC" ]]; then
  tar -xzf "$SDIST" -C "$WORK"
fi

echo "build-llama-server: compiling llama-server (-j$JOBS, several minutes on two cores)" >&2
nice -n 10 cmake -S "$SRC" -B "$WORK/build" "${CMAKE_FLAGS[@]}" >&2
nice -n 10 cmake --build "$WORK/build" --target llama-server -j "$JOBS" >&2

mkdir -p "$DEST"
cp "$SRC/models/templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja" "$TEMPLATE"
cp "$WORK/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
rm -rf "$WORK"
echo "$BIN"
