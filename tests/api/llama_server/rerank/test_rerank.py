"""POST /v1/rerank (and /rerank, /v1/reranking, /reranking) end to end on a reranker: the
tiny random BERT of edge_testkit/models/make_test_reranker.py (rank pooling, a classifier head, a
WordPiece vocabulary), served by the real server. Scores are checked against themselves
(each pair scored alone, in any batch, in any order), the pair layout by its token count,
the shapes of Jina/Cohere and TEI answers, OpenAI-style 400s naming the field, and the
refusals of every other kind of work by name."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server, write_test_reranker

from edge_server.api.llama_server.rerank.protocol import MAX_RERANK_DOCUMENTS, RerankResponse
from edge_testkit.models import make_test_fim_model

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "Bananas are yellow and grow in bunches.",
    "The city of light sits on the Seine.",
    "x",
    "def add(a, b): return a + b",
]
MODEL = "reranker"  # the file's stem: the model's id


def start_reranker(tmp: Path, **model: Any) -> RunningServer:
    path = write_test_reranker(tmp / f"{MODEL}.gguf", **model)
    return start_server(tmp, "--model", str(path), "--parallel", "1", "--ctx-size", "1024")


@pytest.fixture(scope="module")
def reranker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_reranker(tmp_path_factory.mktemp("reranker"))
    yield running
    stop_server(running)
    assert "Traceback" not in running.log_text(), running.log_text()


@pytest.fixture()
def rr(reranker_server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=reranker_server.base_url, timeout=60) as c:
        yield c


def rerank(rr: httpx.Client, path: str = "/v1/rerank", **body: Any) -> dict[str, Any]:
    r = rr.post(path, json={"query": QUERY, "documents": DOCUMENTS, **body})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def scores_by_index(answer: dict[str, Any]) -> dict[int, float]:
    return {r["index"]: r["relevance_score"] for r in answer["results"]}


def tokens(rr: httpx.Client, text: str) -> list[int]:
    r = rr.post("/tokenize", json={"content": text, "add_special": False,
                                   "parse_special": False})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]  # type: ignore[no-any-return]


def assert_close(a: float, b: float) -> None:
    assert abs(a - b) <= 1e-4 * max(1.0, abs(a)), (a, b)


def test_scores_best_first_and_equal_to_each_pair_alone(rr: httpx.Client) -> None:
    answer = rerank(rr)
    RerankResponse.model_validate(answer)
    results = answer["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    got = [r["relevance_score"] for r in results]
    assert got == sorted(got, reverse=True)
    assert len(set(got)) > 1  # the pairs are told apart
    together = scores_by_index(answer)
    for i, document in enumerate(DOCUMENTS):
        alone = rerank(rr, documents=[document])["results"]
        assert [r["index"] for r in alone] == [0]
        assert_close(alone[0]["relevance_score"], together[i])
    # The documents' order in the request changes nothing but their indices.
    reversed_scores = scores_by_index(rerank(rr, documents=DOCUMENTS[::-1]))
    n = len(DOCUMENTS)
    for i in range(n):
        assert_close(reversed_scores[n - 1 - i], together[i])


def test_concurrent_requests_share_batches_and_agree(rr: httpx.Client,
                                                     reranker_server: RunningServer) -> None:
    expected = scores_by_index(rerank(rr))

    async def many() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=reranker_server.base_url, timeout=60) as c:
            replies = await asyncio.gather(*[
                c.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS})
                for _ in range(6)])
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        return [r.json() for r in replies]

    for answer in asyncio.run(many()):
        for i, score in scores_by_index(answer).items():
            assert_close(score, expected[i])


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v1/reranking", "/reranking"])
def test_top_n_and_return_documents_shape(rr: httpx.Client, path: str) -> None:
    full = rerank(rr, path)
    answer = rerank(rr, path, model="default", top_n=2, return_documents=True)
    RerankResponse.model_validate(answer)
    assert answer["object"] == "list" and answer["model"] == MODEL
    assert answer["id"].startswith("rerank-")
    assert [r["index"] for r in answer["results"]] == [r["index"] for r in full["results"][:2]]
    for r in answer["results"]:
        assert set(r) == {"index", "relevance_score", "document"}
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}
    assert all("document" not in r for r in full["results"])  # only when asked
    # Usage counts every pair scored, not only those returned.
    assert answer["usage"] == full["usage"]
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0


def test_documents_as_objects(rr: httpx.Client) -> None:
    plain = scores_by_index(rerank(rr))
    objects = rerank(rr, documents=[{"text": d} for d in DOCUMENTS], return_documents=True)
    for r in objects["results"]:
        assert_close(r["relevance_score"], plain[r["index"]])
        assert r["document"]["text"] == DOCUMENTS[r["index"]]


def test_pairs_are_bos_query_sep_document(rr: httpx.Client) -> None:
    """llama-server's layout without a rerank template: this vocabulary adds BOS ([CLS])
    and SEP but no EOS, so a pair is [CLS] query [SEP] document; the caller's text is
    read as plain text, control-token text included."""
    query = tokens(rr, QUERY)
    for document in ("Paris is the capital of France.", "[SEP] [CLS]"):
        answer = rerank(rr, documents=[document])
        expected = 1 + len(query) + 1 + len(tokens(rr, document))
        assert answer["usage"]["prompt_tokens"] == expected
    assert len(tokens(rr, "[SEP]")) > 1


def test_rerank_template_lays_out_pairs(tmp_path: Path) -> None:
    """With `tokenizer.chat_template.rerank`, a pair is that text with the query and
    document in place: the template's special tokens parsed, the caller's text not."""
    template = "[CLS]query: {query}[SEP]document: {document}[SEP]"
    server = start_reranker(tmp_path, rerank_template=template)
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as c:
            markup = tokens(c, "query: ") + tokens(c, "document: ")
            for document in ("Paris.", "[SEP]"):
                answer = rerank(c, documents=[document])
                expected = 3 + len(markup) + len(tokens(c, QUERY)) + len(tokens(c, document))
                assert answer["usage"]["prompt_tokens"] == expected
            got = [r["relevance_score"] for r in rerank(c)["results"]]
    finally:
        stop_server(server)
    assert "Traceback" not in server.log_text()
    assert got == sorted(got, reverse=True) and len(got) == len(DOCUMENTS)


def test_tei_shape(rr: httpx.Client) -> None:
    jina = scores_by_index(rerank(rr))
    r = rr.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert isinstance(answer, list) and len(answer) == len(DOCUMENTS)
    got = [item["score"] for item in answer]
    assert got == sorted(got, reverse=True)
    for item in answer:
        assert set(item) == {"index", "score", "text"}
        assert item["text"] == DOCUMENTS[item["index"]]
        assert_close(item["score"], jina[item["index"]])


@pytest.mark.parametrize("body, param", [
    ({"documents": None}, "documents"),
    ({"documents": []}, "documents"),
    ({"documents": ["a"] * (MAX_RERANK_DOCUMENTS + 1)}, "documents"),
    ({"documents": ["a", "word " * 600]}, "documents[1]"),
    ({"documents": ["a", "b" * 100_000]}, "documents[1]"),
    ({"query": "word " * 600}, "query"),
    ({"top_n": 0}, "top_n"),
    ({"top_n": len(DOCUMENTS) + 1}, "top_n"),
    ({"query": 3}, "query"),
    ({"documents": ["a", 3]}, "documents[1]"),
    ({"texts": ["a"]}, "texts"),  # both lists
    ({"documents": None, "texts": ["a", "word " * 600]}, "texts[1]"),
])
def test_bad_input_is_a_400_naming_the_field(rr: httpx.Client, body: dict[str, Any],
                                              param: str) -> None:
    request = {"query": QUERY, "documents": DOCUMENTS, **body}
    request = {k: v for k, v in request.items() if v is not None}
    r = rr.post("/v1/rerank", json=request)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    if "word " in str(body) or "b" * 100 in str(body):
        assert error["code"] == "context_length_exceeded"
    # The server still serves.
    rerank(rr, documents=["a"])


@pytest.mark.parametrize("path, body", [
    ("/v1/embeddings", {"input": "hello"}),
    ("/embeddings", {"input": "hello"}),
    ("/api/embed", {"input": "hello"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("/completion", {"prompt": "hi", "n_predict": 2}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/api/generate", {"prompt": "hi", "stream": False}),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "stream": False}),
])
def test_other_work_is_refused_naming_the_reranker(rr: httpx.Client, path: str,
                                                   body: dict[str, Any]) -> None:
    r = rr.post(path, json={"model": "default", **body})
    assert r.status_code == 400, r.text
    assert "reranker" in r.text
    if path.startswith(("/v1/embeddings", "/v1/chat", "/v1/completions", "/embeddings")):
        assert r.json()["error"]["param"] == "model"


def test_a_model_that_is_no_reranker_is_refused(http: httpx.Client) -> None:
    r = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "model" and "not a reranker" in error["message"]


def write_causal_reranker(path: Path, **kwargs: Any) -> Path:
    return make_test_fim_model.write_model(path, rank_pooling=True, **kwargs)


def test_causal_reranker_needs_its_rerank_template(tmp_path: Path) -> None:
    """A causal reranker (Qwen3-Reranker style) scores the answer to a yes/no prompt: it
    is served with its GGUF's rerank template and refused by name without one."""
    template = "<s>Query: {query}\nDocument: {document}\nRelevant:"
    for name, kwargs in (("bare", {}), ("templated", {"rerank_template": template})):
        model = write_causal_reranker(tmp_path / f"{name}.gguf", **kwargs)
        server = start_server(tmp_path, "--model", str(model), "--parallel", "1",
                              "--ctx-size", "1024", name=name)
        try:
            with httpx.Client(base_url=server.base_url, timeout=60) as c:
                if name == "bare":
                    r = c.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
                    assert r.status_code == 400, r.text
                    error = r.json()["error"]
                    assert error["param"] == "model"
                    assert "rerank template" in error["message"]
                else:
                    answer = rerank(c)
                    got = [r["relevance_score"] for r in answer["results"]]
                    assert got == sorted(got, reverse=True)
                    alone = rerank(c, documents=DOCUMENTS[:1])
                    assert_close(alone["results"][0]["relevance_score"],
                                 scores_by_index(answer)[0])
                r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
                assert r.status_code == 400 and "reranker" in r.text
        finally:
            stop_server(server)
        assert "Traceback" not in server.log_text()
