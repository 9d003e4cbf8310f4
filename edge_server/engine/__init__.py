"""The inference engine: continuous batching over one llama.cpp context. It knows no HTTP.

The scheduler core sits at this level: `engine` (one served model behind one object),
`scheduler` (the step loop), `delivery` (when a step's tokens go to the callers),
`seating` (where a request's sequences start), `step_batch` (one step's rows),
`image_prefill`, `jobs`, `waiting` (the queue), `request` (the whole
interface to callers: requests, handles, deltas), `text_stream` (stop strings, UTF-8),
`chat_template` and `errors`.

Each sub-package owns one concern, layered (import-linter contracts in pyproject.toml):
    scheduler core (this level)
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
from edge_server.engine.scheduler import SchedulerSettings

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
