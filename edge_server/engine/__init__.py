"""The inference engine: continuous batching over one llama.cpp context. It knows no HTTP.

At this level: `engine` (one served model behind one object), `request` (the whole
interface to callers: requests, handles, deltas), `text_stream` (stop strings, UTF-8),
`chat_template` with `template_env` (the GGUF's Jinja template) and `errors`.
`sched/` is the step loop: `scheduler` (one step as a list of verbs), `waiting` (the
queue), `seating` (where a request's sequences start), `step_batch` (one step's rows),
`decode_groups`, `image_prefill`, `jobs`, `delivery` (when a step's tokens go to the
callers) and `slot_view` (what /slots reads).

Each sub-package owns one concern, layered (import-linter contracts in pyproject.toml):
    engine
    sched
    request, text_stream, chat_template, template_env
    embeddings | multimodal | kv | sampling
    grammar | backend | errors
A lower layer never imports a higher one; siblings never import each other.
Imported by: the model pool (edge_server.catalogue.pool) and the HTTP layer (edge_server.api).
"""

from edge_server.engine.backend.llama_model import ContextSettings, ModelLoadError
from edge_server.engine.engine import Engine, EngineSettings
from edge_server.engine.errors import EngineError, EngineOverloaded
from edge_server.engine.request import ChoiceDelta, FinishReason, GenerationRequest, Usage
from edge_server.engine.sampling.chain import SamplingParams
from edge_server.engine.sched.settings import SchedulerSettings

__all__ = [
    "ChoiceDelta",
    "ContextSettings",
    "Engine",
    "EngineError",
    "EngineOverloaded",
    "EngineSettings",
    "FinishReason",
    "GenerationRequest",
    "ModelLoadError",
    "SamplingParams",
    "SchedulerSettings",
    "Usage",
]
