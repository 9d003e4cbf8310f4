#!/usr/bin/env bash
# Builds llama.cpp's own llama-server from the llama-cpp-python sdist that the project
# installs, so benchmarks compare against the very llama.cpp edge_server links.
# Output: .bench/llama.cpp/build/bin/llama-server (CMAKE_ARGS selects a backend, as for pip).
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$(.venv/bin/python -c "import llama_cpp; print(llama_cpp.__version__)")
mkdir -p .bench
if [ ! -d .bench/llama.cpp ]; then
    .venv/bin/python -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d .bench/sdist
    tar -xzf ".bench/sdist/llama_cpp_python-$version.tar.gz" -C .bench
    mv ".bench/llama_cpp_python-$version/vendor/llama.cpp" .bench/llama.cpp
    rm -rf ".bench/llama_cpp_python-$version" .bench/sdist
fi
# shellcheck disable=SC2086
cmake -S .bench/llama.cpp -B .bench/llama.cpp/build -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF ${CMAKE_ARGS:-} >/dev/null
cmake --build .bench/llama.cpp/build -j"$(nproc)" --target llama-server llama-batched-bench llama-perplexity
echo ".bench/llama.cpp/build/bin/llama-server"
