"""A created model's Modelfile applied to each request that names it, as Ollama applies
it: PARAMETER values are the defaults the request's `options` override; SYSTEM is the
system prompt where the request gives none; TEMPLATE renders the prompt in place of the
model's chat template, turn by turn as Ollama renders templates without `.Messages`.
"""

from __future__ import annotations

from typing import Any

from edge_server.api.common.bounds.prompt_bounds import prompt_size_limit, rendered_too_long
from edge_server.api.http.errors import invalid
from edge_server.api.ollama.management.saved_models import Profile
from edge_server.api.ollama.protocol import ChatRequest, GenerateRequest, Message
from edge_server.api.ollama.translate import render_template
from edge_server.engine import Engine


def _options(profile: Profile, options: dict[str, Any] | None) -> dict[str, Any]:
    return {**profile.parameters, **(options or {})}


def chat(req: ChatRequest, profile: Profile) -> ChatRequest:
    messages = req.messages
    if profile.system is not None and not any(m.role == "system" for m in messages):
        messages = [Message(role="system", content=profile.system), *messages]
    return req.model_copy(update={"options": _options(profile, req.options),
                                  "messages": messages})


def generate(req: GenerateRequest, profile: Profile) -> GenerateRequest:
    update: dict[str, Any] = {"options": _options(profile, req.options)}
    if req.system is None and not req.raw and req.suffix is None:
        update["system"] = profile.system
    return req.model_copy(update=update)


def turns_prompt(template: str, messages: list[Message], engine: Engine) -> str:
    """Ollama's rendering for a template without `.Messages`: each exchange (system,
    prompt, response) renders the template once; the last stops where the answer goes.
    Stopped (a 400) once the text passes what could fit the context."""
    out: list[str] = []
    size = 0
    system = prompt = response = ""

    def add(text: str) -> None:
        nonlocal size
        size += len(text)
        if size > prompt_size_limit(engine):
            raise rendered_too_long("template", engine)
        out.append(text)

    def flush() -> None:
        nonlocal system, prompt, response
        add(render_template(template, {"system": system, "prompt": prompt,
                                       "response": response}, engine))
        system = prompt = response = ""

    for message in messages:
        content = message.content or ""
        if message.role == "system":
            if prompt or response:
                flush()
            system = content
        elif message.role == "user":
            if response:
                flush()
            prompt = content
        elif message.role == "assistant":
            response = content
    add(render_template(template, {"system": system, "prompt": prompt,
                                   "response": response}, engine, until_response=True))
    return "".join(out)


def _text_only(req: ChatRequest) -> None:
    if req.tools:
        raise invalid("tools", "`tools` need the model's chat template; this model's "
                      "TEMPLATE renders text only")
    for i, message in enumerate(req.messages):
        if message.images:
            raise invalid(f"messages[{i}].images", "images need the model's chat template; "
                          "this model's TEMPLATE renders text only")
        if message.role == "tool":
            raise invalid(f"messages[{i}].role", "tool answers need the model's chat "
                          "template; this model's TEMPLATE renders text only")


def chat_as_text(req: ChatRequest, template: str, engine: Engine) -> GenerateRequest:
    """A chat on a model with a TEMPLATE: its prompt spelled out, then generated raw."""
    _text_only(req)
    return GenerateRequest(model=req.model, prompt=turns_prompt(template, req.messages, engine),
                           raw=True, format=req.format, options=req.options,
                           logprobs=req.logprobs, top_logprobs=req.top_logprobs,
                           truncate=req.truncate, shift=req.shift)  # a cut keeps its head


def generate_as_text(req: GenerateRequest, template: str, engine: Engine) -> GenerateRequest:
    """A templated generate on a model with a TEMPLATE: one exchange, rendered as a chat
    of its system prompt and prompt would be."""
    if req.images:
        raise invalid("images", "`images` need the model's chat template; this model's "
                      "TEMPLATE renders text only")
    messages = [Message(role="system", content=req.system)] if req.system else []
    messages.append(Message(role="user", content=req.prompt or ""))
    return req.model_copy(update={"prompt": turns_prompt(template, messages, engine), "raw": True,
                                  "system": None})
