"""What a request chose of the model's extras, checked against what was loaded: its LoRA
adapter set (llama-server's `lora`) and its draft model (LM Studio's `draft_model`)."""

from __future__ import annotations

from edge_server.engine.backend.lora import LoraAdapters
from edge_server.engine.errors import EngineError
from edge_server.engine.request import GenerationRequest
from edge_server.engine.sched.model_draft import DraftModel, requested_draft_problem


def resolve_choices(request: GenerationRequest, lora: LoraAdapters,
                    drafter: DraftModel | None, model_id: str) -> None:
    """Sets `request.adapters`; a 400 naming the field where a choice cannot be had."""
    if request.lora is None:
        request.adapters = lora.default_set()
    else:
        reason = lora.check_request(request.lora)
        if reason is not None:
            raise EngineError(f"`lora`: {reason}", status=400, code="invalid_lora")
        request.adapters = lora.requested_set(request.lora)
    if request.draft_model is not None:
        problem = requested_draft_problem(drafter, request.draft_model, model_id,
                                          request.draft)
        if problem is not None:
            raise EngineError(f"`draft_model`: {problem}", status=400,
                              code="invalid_draft_model")
