"""Files in requests (Responses' `input_file` parts): the text the model reads of them.

A file comes as a data URL (`data:<type>;base64,…`) with its `filename`. Text files
(`text/*`, JSON) are their UTF-8 text; a PDF is the text of its pages, read with pypdf,
bounded in bytes, pages and characters before and while it is read. Any other type is
refused by name; so are `file_id` (no Files API here) and `file_url` parts.
Reading runs on the preparation threads, never on the event loop.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging

from edge_server.api.http.errors import APIError, invalid, unsupported

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 8 << 20  # decoded; the request body is bounded before this
MAX_PDF_PAGES = 100
# Text taken from one file: past this it is refused, as a prompt that long would be.
MAX_FILE_CHARS = 1_000_000
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-yaml")
_PDF = "application/pdf"


def file_text(file_data: str | None, filename: str | None, where: str) -> str:
    """The text a file part gives the model, headed by its name."""
    if not file_data:
        raise unsupported(where, "needs `file_data` (a data URL); `file_id` and `file_url` "
                          "are not served: this server keeps no files and fetches none")
    media_type, data = _decoded(file_data, where)
    if media_type == _PDF:
        text = _pdf_text(data, where)
    elif media_type.startswith(_TEXT_TYPES):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise invalid(where, f"{where}: a {media_type} file must be UTF-8 text") from exc
    else:
        raise unsupported(where, f"({media_type[:64]}) is not served: text and PDF files are")
    if len(text) > MAX_FILE_CHARS:
        raise invalid(where, f"{where}: the file's text is over {MAX_FILE_CHARS:,} "
                      "characters", "file_too_large")
    name = (filename or "file")[:256]
    return f"{name}:\n{text}"


def _decoded(file_data: str, where: str) -> tuple[str, bytes]:
    header, comma, payload = file_data.partition(",")
    if not (comma and header.startswith("data:") and header.endswith(";base64")):
        raise invalid(where, f"{where}: `file_data` must be a base64 data URL "
                      "(data:<type>;base64,...)")
    media_type = header[len("data:"):-len(";base64")].strip().lower() or "text/plain"
    if len(payload) > (MAX_FILE_BYTES * 4) // 3 + 4:
        raise invalid(where, f"{where}: the file is over {MAX_FILE_BYTES >> 20} MiB",
                      "file_too_large")
    try:
        return media_type, base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(where, f"{where}: `file_data` is not valid base64") from exc


def _pdf_text(data: bytes, where: str) -> str:
    # Imported here: only requests with PDFs pay for the library.
    import pypdf

    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        pages = reader.pages
        if len(pages) > MAX_PDF_PAGES:
            raise invalid(where, f"{where}: the PDF has {len(pages)} pages, over "
                          f"{MAX_PDF_PAGES}", "file_too_large")
        texts: list[str] = []
        taken = 0
        for page in pages:
            text = page.extract_text() or ""
            taken += len(text)
            if taken > MAX_FILE_CHARS:
                raise invalid(where, f"{where}: the file's text is over "
                              f"{MAX_FILE_CHARS:,} characters", "file_too_large")
            texts.append(text)
    except APIError:
        raise
    except Exception as exc:  # a damaged or hostile file: pypdf raises many kinds
        log.info("%s: not read as a PDF: %s", where, exc)
        raise invalid(where, f"{where}: the file could not be read as a PDF") from exc
    return "\n\n".join(texts)
