"""How deep lookup drafting may go: the operator's `draft_max`, held to what the model's
memory can take back, and off where the decode step's cost was not measured."""

from __future__ import annotations

import logging
from pathlib import Path

from edge_server.engine.backend.llama_model import LlamaModel
from edge_server.engine.backend.measure.step_cost import (
    StepCost,
    load_or_measure,
    unmeasured_reason,
)
from edge_server.engine.sched.settings import DEFAULT_DRAFT_MAX

log = logging.getLogger(__name__)


def draft_depth(draft_max: int, model: LlamaModel) -> int:
    """`draft_max` -1 is DEFAULT_DRAFT_MAX where every layer runs on the CPU, else 0."""
    depth = draft_max if draft_max >= 0 else (DEFAULT_DRAFT_MAX if model.cpu_only else 0)
    kind = model.memory_kind
    if depth > 0 and not kind.drafts:
        # A rejected draft could not be removed from this memory (memory_kind.py).
        log.info("lookup drafting off: a %s model's memory (%s) cannot take back a "
                 "rejected draft", kind.kind, kind.arch)
        return 0
    if depth > kind.draft_limit(depth):
        log.info("drafts at most %d deep: what llama.cpp can roll back of a %s model's "
                 "last decode (%s)", kind.rollback, kind.kind, kind.arch)
        return kind.draft_limit(depth)
    return depth


def measure_step_cost(model: LlamaModel, cost_file: Path | None,
                      depth: int) -> tuple[StepCost | None, bool]:
    """On the engine thread: this machine's step cost (measured once, then read from
    `cost_file`), and whether drafts may be chosen by cost this run (a guessed cost
    could make them lose: then only forced drafts, --draft-min or a request's
    draft_model, are made)."""
    if depth <= 0 and not model.cpu_only:
        return None, True
    try:
        measured = load_or_measure(model, cost_file)
    except Exception:  # drafting falls back to the fixed model; serving goes on
        log.exception("could not measure the decode step cost")
        measured = None
    if measured is None and cost_file is not None and depth > 0:
        log.warning("decode step cost not measured (%s): until the next start, drafts "
                    "only where forced (--draft-min, a request's draft_model)",
                    unmeasured_reason(model))
        return None, False
    return measured, True
