# Shared by serve.sh and test.sh: a project-local virtual environment with the project
# installed in editable mode.
install_project() {
    local target="$1"
    local python="${PYTHON:-python3}"
    if [ ! -x .venv/bin/python ]; then
        "$python" -m venv .venv
    fi
    .venv/bin/python -m pip install --quiet --upgrade pip
    # llama-cpp-python builds llama.cpp from source; CMAKE_ARGS selects the backend
    # (for example -DGGML_METAL=on or -DGGML_CUDA=on); the default is the CPU build.
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}" \
        .venv/bin/python -m pip install --quiet -e "$target"
}
