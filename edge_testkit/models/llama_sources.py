"""The llama.cpp sources that the installed llama-cpp-python vendors, as test material.

The sdist's `vendor/llama.cpp` holds real Hugging Face chat templates
(`models/templates/`), each family's native outputs (`tests/test-chat.cpp`) and real
tokenizers (`models/ggml-vocab-*.gguf`). They are downloaded once (`pip download` of
the exact installed version, from the package registry) and the parts asked for are
extracted into a cache outside the checkout:
`${EDGE_SERVER_LLAMA_SOURCES:-${XDG_CACHE_HOME:-~/.cache}/edge-server/llama-sources-<v>}`.

`python -m edge_testkit.models.llama_sources` prints the directory of `vendor/llama.cpp`.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# What tests use; the rest of the sdist (sources of the C++ library) is not extracted.
PARTS = ("models/", "tests/test-chat.cpp", "common/chat")


def version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def cache_dir() -> Path:
    configured = os.environ.get("EDGE_SERVER_LLAMA_SOURCES")
    if configured:
        return Path(configured)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "edge-server" / f"llama-sources-{version()}"


def vendor_dir() -> Path:
    """`vendor/llama.cpp` with PARTS extracted: downloaded on first use, then reused."""
    out = cache_dir()
    done = out / ".complete"
    root = out / "llama.cpp"
    if done.exists():
        return root
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as work:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", f"llama-cpp-python=={version()}", "-d", work],
            check=True, stdout=subprocess.DEVNULL,
        )
        (archive,) = Path(work).glob("llama_cpp_python-*.tar.gz")
        prefix = f"{archive.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if not member.name.startswith(prefix) or not member.isfile():
                    continue
                inner = member.name[len(prefix):]
                if not inner.startswith(PARTS):
                    continue
                source = tar.extractfile(member)
                assert source is not None
                target = root / inner
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source.read())
    done.touch()
    return root


if __name__ == "__main__":
    print(vendor_dir())
