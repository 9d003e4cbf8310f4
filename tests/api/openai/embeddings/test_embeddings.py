"""POST /v1/embeddings against the real server: OpenAI's protocol through the official
client and LangChain, numeric agreement with llama-cpp-python's own embedding code,
batching of concurrent requests, and OpenAI-shaped errors for bad input."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from conftest import DEFAULT_MODEL, RunningServer

from edge_server.api.openai.embeddings.protocol import EmbeddingResponse

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
    "def add(a, b):\n    return a + b",
    "Embeddings map text to vectors; similar texts get similar vectors.",
]
URL = "/v1/embeddings"


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def vectors(response: Any) -> list[np.ndarray]:
    return [np.asarray(d.embedding, dtype=np.float64) for d in response.data]


def embed_raw(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post(URL, json={"model": DEFAULT_MODEL, **body})
    assert r.status_code == 200, r.text
    EmbeddingResponse.model_validate(r.json())  # the documented response schema holds
    return r.json()  # type: ignore[no-any-return]


def tokens_of(http: httpx.Client, text: str) -> list[int]:
    # The tokens the embeddings endpoint evaluates for a text: special tokens added as
    # the model's vocabulary says, control-token text read as plain text.
    r = http.post("/tokenize", json={"model": DEFAULT_MODEL, "content": text,
                                     "add_special": True, "parse_special": False})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]  # type: ignore[no-any-return]


def embedding_stats(http: httpx.Client) -> dict[str, int]:
    return http.get("/health").json()["models"][DEFAULT_MODEL]  # type: ignore[no-any-return]


# --- the official client -------------------------------------------------------------------

def test_string_input(client: openai.OpenAI, http: httpx.Client) -> None:
    # The client asks for base64 unless told otherwise, and decodes it itself.
    r = client.embeddings.create(model="default", input=TEXTS[0], user="someone")
    assert r.object == "list" and r.model == DEFAULT_MODEL
    assert len(r.data) == 1
    item = r.data[0]
    assert item.object == "embedding" and item.index == 0
    vector = np.asarray(item.embedding)
    assert vector.ndim == 1 and vector.size > 0
    assert abs(np.linalg.norm(vector) - 1.0) < 1e-4  # L2-normalized, as OpenAI's
    assert r.usage.prompt_tokens == len(tokens_of(http, TEXTS[0])) == r.usage.total_tokens


def test_list_input_keeps_order_and_counts_tokens(client: openai.OpenAI,
                                                  http: httpx.Client) -> None:
    r = client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS)
    assert [d.index for d in r.data] == list(range(len(TEXTS)))
    got = vectors(r)
    assert len({v.size for v in got}) == 1
    for v in got:
        assert abs(np.linalg.norm(v) - 1.0) < 1e-4
    # Different texts, different vectors; each in its own place.
    assert cosine(got[0], got[1]) < 0.9999
    alone = vectors(client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS[2]))[0]
    assert cosine(alone, got[2]) >= 0.9999
    assert r.usage.prompt_tokens == sum(len(tokens_of(http, t)) for t in TEXTS)
    assert r.usage.total_tokens == r.usage.prompt_tokens


def test_token_inputs_match_text(client: openai.OpenAI, http: httpx.Client) -> None:
    token_lists = [tokens_of(http, t) for t in TEXTS[:3]]
    from_text = vectors(client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS[:3]))
    one = client.embeddings.create(model=DEFAULT_MODEL, input=token_lists[0])
    assert len(one.data) == 1 and one.usage.prompt_tokens == len(token_lists[0])
    assert cosine(vectors(one)[0], from_text[0]) >= 0.9999
    many = client.embeddings.create(model=DEFAULT_MODEL, input=token_lists)
    assert [d.index for d in many.data] == [0, 1, 2]
    for got, want in zip(vectors(many), from_text, strict=True):
        assert cosine(got, want) >= 0.9999


def test_base64_decodes_to_the_float_vectors(client: openai.OpenAI,
                                             http: httpx.Client) -> None:
    as_float = embed_raw(http, input=TEXTS[:2], encoding_format="float")
    as_base64 = embed_raw(http, input=TEXTS[:2], encoding_format="base64")
    default = embed_raw(http, input=TEXTS[:2])
    for f, b, d in zip(as_float["data"], as_base64["data"], default["data"], strict=True):
        assert isinstance(b["embedding"], str)
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        # The JSON floats are the float32 values exactly: the same numbers either way.
        assert np.array_equal(decoded, np.asarray(f["embedding"], dtype=np.float32))
        assert f["embedding"] == d["embedding"]  # "float" is the default
    client_float = client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS[0],
                                            encoding_format="float")
    client_default = client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS[0])
    assert client_float.data[0].embedding == client_default.data[0].embedding


def test_batched_and_single_agree(client: openai.OpenAI) -> None:
    batched = vectors(client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS))
    for text, vector in zip(TEXTS, batched, strict=True):
        single = vectors(client.embeddings.create(model=DEFAULT_MODEL, input=text))[0]
        assert cosine(single, vector) >= 0.9999, text


def test_dimensions_equal_to_the_width_is_accepted(client: openai.OpenAI) -> None:
    width = len(client.embeddings.create(model=DEFAULT_MODEL, input="x").data[0].embedding)
    r = client.embeddings.create(model=DEFAULT_MODEL, input="x", dimensions=width)
    assert len(r.data[0].embedding) == width
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=DEFAULT_MODEL, input="x", dimensions=width // 2)
    assert err.value.param == "dimensions"


def test_concurrent_requests_share_batches(client: openai.OpenAI, http: httpx.Client,
                                           async_client: openai.AsyncOpenAI) -> None:
    texts = [f"Request {i}: " + TEXTS[i % len(TEXTS)] * 2 for i in range(16)]
    before = embedding_stats(http)

    async def burst() -> list[Any]:
        async with async_client:
            return await asyncio.gather(*(
                async_client.embeddings.create(model=DEFAULT_MODEL, input=t) for t in texts))

    responses = asyncio.run(burst())
    after = embedding_stats(http)
    assert len(responses) == 16
    for r in responses:
        assert len(r.data) == 1 and abs(np.linalg.norm(r.data[0].embedding) - 1) < 1e-4

    def delta(key: str) -> int:
        return after[key] - before.get(key, 0)

    assert delta("embedding_requests") == 16 and delta("embedding_inputs") == 16
    # One worker drains every waiting request into each llama_decode: 16 requests that
    # arrive together take fewer decodes than requests, some holding several requests.
    assert delta("embedding_batches") < 16
    assert delta("embedding_shared_batches") >= 1
    metrics = http.get("/metrics").text
    assert f'edge_server_embedding_batches_total{{model="{DEFAULT_MODEL}"}}' in metrics
    assert 'edge_server_requests_total{endpoint="/v1/embeddings",status="200"}' in metrics
    # Each vector is the one the text gets alone.
    alone = vectors(client.embeddings.create(model=DEFAULT_MODEL, input=texts[5]))[0]
    assert cosine(alone, responses[5].data[0].embedding) >= 0.9999


# --- reference implementation and other clients --------------------------------------------

def test_agrees_with_llama_cpp_python(client: openai.OpenAI,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-cpp-python's high-level Llama, with the pooling our server uses for a model
    that declares none (mean), embeds the same texts to the same vectors."""
    import llama_cpp
    import llama_cpp.llama_cpp as low_level

    from edge_server.catalogue.default_conversion import served_default_model_path
    from edge_server.engine.backend.cpu.cpu_probe import extra_buffers_safe

    path = served_default_model_path()  # the file the server serves (the same cache)
    # Where llama.cpp's AMX kernels crash (the server probes this), the reference must
    # load with the plain CPU kernels too, or it would take this process down.
    info = low_level.llama_print_system_info().decode(errors="replace")
    safe = extra_buffers_safe(path, "auto", info)
    default_params = low_level.llama_model_default_params

    def model_params() -> Any:
        params = default_params()
        params.use_extra_bufts = safe
        return params

    monkeypatch.setattr(low_level, "llama_model_default_params", model_params)
    reference = llama_cpp.Llama(model_path=str(path), embedding=True, n_threads=1,
                                pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                                n_ctx=512, verbose=False)
    try:
        expected = [reference.embed(text, normalize=True) for text in TEXTS]
    finally:
        reference.close()
    got = vectors(client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS))
    for text, want, have in zip(TEXTS, expected, got, strict=True):
        assert len(want) == have.size
        assert cosine(want, have) >= 0.999, text


def test_langchain_openai_embeddings(server: RunningServer, client: openai.OpenAI) -> None:
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: by default LangChain tokenizes texts with
    # tiktoken's cl100k_base (downloading it) and sends those token ids, which belong to
    # OpenAI's vocabulary, not the served model's. Off, it sends the texts themselves.
    embeddings = OpenAIEmbeddings(model=DEFAULT_MODEL, base_url=server.v1, api_key="unused",
                                  check_embedding_ctx_length=False, max_retries=0)
    documents = embeddings.embed_documents(TEXTS)
    query = embeddings.embed_query(TEXTS[1])
    ours = vectors(client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS))
    assert len(documents) == len(TEXTS)
    for doc, want in zip(documents, ours, strict=True):
        assert cosine(doc, want) >= 0.9999
    assert cosine(query, ours[1]) >= 0.9999
    # The query is nearest its own document.
    assert max(range(len(TEXTS)), key=lambda i: cosine(query, documents[i])) == 1


def test_openapi_documents_the_request(http: httpx.Client) -> None:
    import jsonschema

    doc = http.get("/openapi.json").json()
    op = doc["paths"][URL]["post"]
    assert op["operationId"] == "createEmbedding"
    schema = {"$ref": "#/components/schemas/EmbeddingRequest",
              "components": doc["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    for value in ("hi", ["a", "b"], [1, 2], [[1], [2]]):
        validator.validate({"model": "m", "input": value, "encoding_format": "base64"})
    assert not validator.is_valid({"model": "m"})
    assert not validator.is_valid({"model": "m", "input": "a", "encoding_format": "hex"})


# --- bad input -------------------------------------------------------------------------

_TOO_MANY_TOKENS = "word " * 3000  # past the embedding context of 2048 tokens

BAD = [
    # (body fields, status, param, code)
    ({"input": ""}, 400, "input", "invalid_value"),
    ({"input": []}, 400, "input", "invalid_value"),
    ({"input": ["a", ""]}, 400, "input[1]", "invalid_value"),
    ({"input": [[1, 2], []]}, 400, "input[1]", "invalid_value"),
    ({"input": [1, 2, 99_999_999]}, 400, "input", "invalid_value"),
    ({"input": [[5, 6], [-1]]}, 400, "input[1]", "invalid_value"),
    ({"input": _TOO_MANY_TOKENS}, 400, "input", "context_length_exceeded"),
    ({"input": ["ok", _TOO_MANY_TOKENS]}, 400, "input[1]", "context_length_exceeded"),
    ({"input": [[5] * 2049]}, 400, "input[0]", "context_length_exceeded"),
    ({"input": "x" * 2_000_000}, 400, "input", "context_length_exceeded"),
    ({"input": ["a"] * 2049}, 400, "input", "invalid_value"),
    ({"input": {"text": "a"}}, 400, "input", "invalid_value"),
    ({"input": ["a", 1]}, 400, "input", "invalid_value"),
    ({}, 400, "input", "missing_required_parameter"),
    ({"input": "a", "dimensions": 3}, 400, "dimensions", "unsupported_parameter"),
    ({"input": "a", "dimensions": 0}, 400, "dimensions", "invalid_value"),
    ({"input": "a", "encoding_format": "hex"}, 400, "encoding_format", "invalid_value"),
    ({"input": "a", "model": "no-such-model"}, 404, "model", "model_not_found"),
]


@pytest.mark.parametrize(("fields", "status", "param", "code"), BAD)
def test_bad_input_is_refused_by_name(http: httpx.Client, fields: dict[str, Any], status: int,
                                      param: str, code: str) -> None:
    r = http.post(URL, json={"model": DEFAULT_MODEL, **fields})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)
    assert "Traceback" not in r.text


def test_still_serves_after_bad_input(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=DEFAULT_MODEL, input="")
    assert err.value.param == "input"
    r = client.embeddings.create(model=DEFAULT_MODEL, input="still here")
    assert len(r.data) == 1
