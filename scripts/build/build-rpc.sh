#!/usr/bin/env bash
# Builds llama.cpp with its RPC backend (-DGGML_RPC=on) from the sdist of the installed
# llama-cpp-python, so the libraries match the Python bindings exactly:
#   <cache>/bin/rpc-server   the worker process run on each box that lends memory
#                            (llama.cpp's ggml-rpc-server target)
#   <cache>/lib/             libllama/libggml*/libmtmd with RPC; point LLAMA_CPP_LIB_PATH
#                            and MTMD_CPP_LIB here for `edge-server serve --rpc ...`
# <cache> is ${EDGE_SERVER_RPC_BUILD:-${XDG_CACHE_HOME:-~/.cache}/edge-server/rpc-<version>}.
# A finished build is reused (CI relies on that); --force rebuilds. CMAKE_ARGS adds backend
# flags as for pip (for example -DGGML_METAL=on). Prints the cache directory on success.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-.venv/bin/python}
version=$("$python" -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
out=${EDGE_SERVER_RPC_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-server/rpc-$version}
if [ "${1:-}" != "--force" ] && [ -f "$out/.complete" ]; then
    echo "$out"
    exit 0
fi
work="$out.work"
mkdir -p "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
    "$python" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$work/sdist" >&2
    tar -xzf "$work/sdist/llama_cpp_python-$version.tar.gz" -C "$work"
fi
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}
# Same options as llama-cpp-python's own build (shared libraries, native CPU), plus RPC;
# the relative rpath lets bin/ and lib/ be copied out of the build tree.
# shellcheck disable=SC2086
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_RPC=on \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;$ORIGIN' \
    ${CMAKE_ARGS:-} >&2
cmake --build "$work/build" -j"$jobs" --target ggml-rpc-server llama mtmd >&2
rm -rf "$out.new"
mkdir -p "$out.new/bin" "$out.new/lib"
cp "$work/build/bin/ggml-rpc-server" "$out.new/bin/rpc-server"
# -a keeps the soname links; libraries land in build/bin on Linux and build/lib elsewhere.
find "$work/build" \( -name 'lib*.so*' -o -name 'lib*.dylib' \) -exec cp -a {} "$out.new/lib/" \;
echo "$version" > "$out.new/.complete"
rm -rf "$out"
mv "$out.new" "$out"
rm -rf "$work"
echo "$out"
