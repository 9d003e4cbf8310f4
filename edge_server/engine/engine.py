"""A served model: its llama.cpp context, scheduler and chat template, behind one object."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp as lc

from .chat_template import CHATML_TEMPLATE, ChatTemplate
from .llama_model import ContextSettings, LlamaModel
from .request import GenerationRequest, RequestHandle
from .scheduler import Scheduler, SchedulerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSettings:
    context: ContextSettings = field(default_factory=ContextSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    chat_template: str | None = None  # overrides the GGUF file's template


class Engine:
    def __init__(self, model_id: str, path: Path, settings: EngineSettings) -> None:
        self.model_id = model_id
        self.path = path
        self.settings = settings
        self.model = LlamaModel(path, settings.context)
        self.vocab = self.model.vocab
        template = settings.chat_template or self.model.chat_template
        if template is None:
            log.warning("%s has no chat template; using ChatML", path.name)
            template = CHATML_TEMPLATE
        self.chat_template = ChatTemplate(
            template,
            bos_token=self.vocab.token_text(self.vocab.bos) if self.vocab.bos >= 0 else "",
            eos_token=self.vocab.token_text(self.vocab.eos) if self.vocab.eos >= 0 else "",
        )
        self.scheduler = Scheduler(self.model, settings.scheduler)
        self.fingerprint = self._fingerprint()
        self.scheduler.start()

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def _fingerprint(self) -> str:
        """Identifies the llama.cpp build and the model file, as system_fingerprint."""
        stat = self.path.stat()
        identity = f"{lc.__version__}|{self.path.name}|{stat.st_size}|{self.model.description}"
        return "fp_" + hashlib.sha256(identity.encode()).hexdigest()[:12]

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        add = add_special and self.vocab.add_bos
        return self.vocab.tokenize(text, add_special=add, parse_special=True)

    def tokenize_chat_text(self, text: str) -> list[int]:
        """Tokens of a rendered chat prompt (special tokens parsed)."""
        # Templates that write the BOS text themselves must not get a second one.
        bos_text = self.chat_template.bos_token
        add_bos = not (bos_text and text.startswith(bos_text))
        return self.tokenize(text, add_special=add_bos)

    def submit(self, request: GenerationRequest) -> RequestHandle:
        return self.scheduler.submit(request)

    def close(self) -> None:
        self.scheduler.stop()
        self.model.close()
