"""The inference engine: llama.cpp context, scheduling and sampling. It knows no HTTP."""

from .engine import Engine, EngineSettings
from .llama_model import ContextSettings, ModelLoadError
from .request import ChoiceDelta, EngineError, EngineOverloaded, GenerationRequest, Usage
from .sampling import SamplingParams
from .scheduler import SchedulerSettings

__all__ = [
    "ChoiceDelta",
    "ContextSettings",
    "Engine",
    "EngineError",
    "EngineOverloaded",
    "EngineSettings",
    "GenerationRequest",
    "ModelLoadError",
    "SamplingParams",
    "SchedulerSettings",
    "Usage",
]
