"""HTTP routes of /v1/audio/transcriptions and /v1/audio/translations: the
multipart/form-data form read within bounds and validated, each field OpenAI documents
served or refused by name."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.http.dependencies import leased_model
from edge_server.api.http.errors import from_validation_error, invalid, unsupported
from edge_server.api.openai.audio.protocol import Task, TranscriptionRequest
from edge_server.api.openai.audio.serving import TranscriptionServing

_serving = TranscriptionServing()
_LISTS = {"timestamp_granularities"}
# OpenAI's fields for what this server does not do.
_REFUSED = {
    "include": "is not served: transcripts come without logprobs",
    "chunking_strategy": "is not served: clips are read in the encoder's own windows",
    "known_speaker_names": "is not served: no speaker diarization",
    "known_speaker_references": "is not served: no speaker diarization",
}
_FORMATS_REFUSED = {"srt", "vtt", "diarized_json"}


async def _form(request: Request, task: Task) -> TranscriptionRequest:
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise invalid(None, "expected a multipart/form-data body (the clip as `file`)",
                      "invalid_request")
    try:
        async with request.form(max_files=1, max_fields=16) as form:
            fields: dict[str, Any] = {}
            for name, value in form.multi_items():
                name = name.removesuffix("[]")
                if name in _REFUSED:
                    raise unsupported(name, _REFUSED[name])
                if isinstance(value, UploadFile):
                    if name != "file":
                        raise invalid(name, "only `file` may be a file")
                    fields["file"] = await value.read()
                elif name in _LISTS:
                    fields.setdefault(name, []).append(value)
                else:
                    fields[name] = value
    except HTTPException as exc:  # Starlette's answer to a malformed multipart body
        raise invalid(None, f"the multipart body could not be read: {exc.detail}",
                      "invalid_request") from exc
    if fields.get("response_format") in _FORMATS_REFUSED:
        raise unsupported("response_format", f"{fields['response_format']!r} is not served: "
                          "the model writes no timestamps (json, text or verbose_json)")
    if task == "translate":
        for name in ("language", "stream", "timestamp_granularities"):
            if name in fields:
                raise unsupported(name, "is not a field of translations")
    if "file" not in fields:
        raise invalid("file", "the clip must be sent as the form's `file`")
    try:
        req = TranscriptionRequest.model_validate(fields)
    except ValidationError as exc:
        raise from_validation_error(exc) from exc
    if req.timestamp_granularities and req.response_format != "verbose_json":
        raise invalid("timestamp_granularities", "needs response_format verbose_json")
    if req.stream and req.response_format != "json":
        raise unsupported("stream", "streams transcript events; response_format must be "
                          "json (the default)")
    return req


async def create_transcription(request: Request) -> Response:
    return await _serve(request, "transcribe")


async def create_translation(request: Request) -> Response:
    return await _serve(request, "translate")


async def _serve(request: Request, task: Task) -> Response:
    body = await _form(request, task)
    async with leased_model(request, body.model) as lease:
        answer = await _serving.create(body, task, lease.engine, request)
        return lease.answer(answer)


routes = [Route("/v1/audio/transcriptions", create_transcription, methods=["POST"]),
          Route("/v1/audio/translations", create_translation, methods=["POST"])]
