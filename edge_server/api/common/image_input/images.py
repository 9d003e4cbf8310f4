"""Images in requests: data URLs (or, where allowed, http(s) URLs) decoded and checked in
Python with Pillow before anything reaches llama.cpp.

Every bound is checked before the work it bounds: the URL's length before base64
decoding, the file's header (format and pixel count) before its pixels are decoded, the
number of images before any is read. What passes is handed to the engine as plain RGB
pixels, so llama.cpp's own image decoders never parse a client's bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from PIL import Image, UnidentifiedImageError

from edge_server.api.common.image_input.image_fetch import fetched
from edge_server.api.common.image_input.url_fetch import FetchError
from edge_server.api.http.errors import APIError, from_engine_error, invalid
from edge_server.engine import EngineOverloaded
from edge_server.engine.multimodal.projector import ImageLimits, ProjectorBusy, RgbImage
from edge_server.engine.multimodal.projector_check import ProjectorError

_FORMATS = {"PNG", "JPEG", "WEBP", "GIF", "BMP"}
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w=.+-]+)*),", re.I)


def decode_image_url(url: str, limits: ImageLimits, param: str) -> RgbImage:
    """A data URL (or, when allowed, an http(s) URL) into checked RGB pixels; a 400
    naming `param` for anything else."""
    if not isinstance(url, str) or not url:
        raise invalid(param, "expected a data URL (data:image/png;base64,...)")
    if url[:8].lower().startswith(("http://", "https://")):
        if not limits.fetch_urls:
            raise invalid(param, "image URLs are not fetched by this server; send the "
                          "image inline as a base64 data URL", "image_url_not_allowed")
        return decode_image_bytes(_fetch(url, param), limits, param)
    match = _DATA_URL.match(url[:256])
    if match is None or ";base64" not in (match.group("params") or "").lower():
        raise invalid(param, "expected a base64 data URL (data:image/png;base64,...)")
    payload = url[match.end():]
    if len(payload) > (limits.max_bytes * 4) // 3 + 4:
        raise invalid(param, f"the image is larger than {limits.max_bytes >> 20} MiB",
                      "image_too_large")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(param, "the image data is not valid base64", "invalid_image") from exc
    return decode_image_bytes(data, limits, param)


def _fetch(url: str, param: str) -> bytes:
    try:
        return fetched(url)
    except FetchError as exc:
        raise invalid(param, exc.message, exc.code) from exc


def decode_image_bytes(data: bytes, limits: ImageLimits, param: str) -> RgbImage:
    if not data:
        raise invalid(param, "the image is empty", "invalid_image")
    if len(data) > limits.max_bytes:
        raise invalid(param, f"the image is larger than {limits.max_bytes >> 20} MiB",
                      "image_too_large")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=sorted(_FORMATS))
            width, height = image.size  # from the header: nothing decoded yet
            if width <= 0 or height <= 0 or width * height > limits.max_pixels:
                raise invalid(param, f"the image is {width} x {height} pixels; at most "
                              f"{limits.max_pixels:,} pixels are accepted", "image_too_large")
            image.load()
            rgb = image.convert("RGB")
    except APIError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise invalid(param, f"the image has more than {limits.max_pixels:,} pixels",
                      "image_too_large") from exc
    except UnidentifiedImageError as exc:
        raise invalid(param, "not an image in a supported format (PNG, JPEG, WebP, GIF, "
                      "BMP)", "invalid_image") from exc
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise invalid(param, "the image data is corrupt or truncated", "invalid_image") from exc
    if max(rgb.size) > limits.max_side:
        rgb.thumbnail((limits.max_side, limits.max_side), Image.Resampling.BICUBIC)
    return RgbImage(rgb.width, rgb.height, rgb.tobytes(), hashlib.sha256(data).hexdigest())


def check_image_count(count: int, limits: ImageLimits, param: str) -> None:
    if count > limits.max_images:
        raise invalid(param, f"{count} images; at most {limits.max_images} per request",
                      "too_many_images")


@contextmanager
def image_errors(param: str) -> Iterator[None]:
    """Preparing images in the model's projector: too many waiting is a 503 with
    Retry-After; an image llama.cpp could not prepare is a 400 naming `param`."""
    try:
        yield
    except ProjectorBusy as exc:
        raise from_engine_error(EngineOverloaded(str(exc), status=503)) from exc
    except ProjectorError as exc:
        raise invalid(param, f"an image could not be prepared: {exc}", "invalid_image") from exc
