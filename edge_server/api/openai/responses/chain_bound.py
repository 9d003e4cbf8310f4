"""How large a stored conversation may grow: what the model could render, in bytes.

A conversation a chained turn renders must fit one sequence's context, and no token
covers more bytes than the vocabulary's longest (prompt_bounds.prompt_size_limit), so
its text is at most that many bytes. The store keeps it as JSON items with ids and
statuses, and JSON escapes some characters: four times the text, plus a little, holds
any conversation the model can render. Images count apart, as the image limits bound
them: a conversation holds at most `max_images` (each request renders all of its
conversation's images), each at most `max_image_mb` before base64; audio clips likewise
(at most `max_clips`, each at most `max_audio_mb`).

Unknown fields are dropped before anything is stored (protocol.py), so the bound is met
by every conversation the model could take; one past it cannot be rendered at all, and
`truncation: "auto"` is not served: it is a 400 before any work (context_length_exceeded,
as OpenAI answers a conversation past the context).
"""

from __future__ import annotations

from edge_server.api.common.bounds.prompt_bounds import prompt_size_limit, too_long
from edge_server.engine import Engine

_JSON_FACTOR = 4
_SLACK = 64 * 1024


def chain_limit(engine: Engine) -> int:
    """Most bytes of stored conversation a turn of this model may continue and add to."""
    limit = _JSON_FACTOR * prompt_size_limit(engine) + _SLACK
    if "image" in engine.modalities:
        images = engine.settings.image_limits
        limit += images.max_images * (images.max_bytes * 4 // 3 + 1024)
    if "audio" in engine.modalities:
        audio = engine.settings.audio_limits
        limit += audio.max_clips * (audio.max_bytes * 4 // 3 + 1024)
    return limit


def check_chain(engine: Engine, stored_bytes: int, input_bytes: int,
                chained: bool) -> None:
    """A 400 where the stored conversation (`stored_bytes`) and the new input together
    are more than the model could render."""
    limit = chain_limit(engine)
    total = stored_bytes + input_bytes
    if total <= limit:
        return
    if chained:
        raise too_long("previous_response_id", (
            f"The conversation stored under previous_response_id and this input come to "
            f"{total} bytes, more than this model's context can hold ({limit} bytes). "
            "Start a new conversation, or send a shorter one as `input`."))
    raise too_long("input", f"The input is {total} bytes, more than this model's context "
                   f"can hold ({limit} bytes).")
