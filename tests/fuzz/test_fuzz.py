"""Fuzzing through the real server over HTTP: mutated requests to every door (Ollama's
/api/* too), generated JSON schemas, broken JSON. Every answer must be one the server may
give (a 2xx, a 4xx in the door's error shape, or a 503/429 for overload; see
edge_testkit.fuzz.judge), come within the time limit on a connection that stays up, and
the server must serve normally afterwards. scripts/soak/fuzz.py runs the same generators
for far longer."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import THREADS_ENV, RunningServer, start_server, stop_server
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from edge_testkit.fuzz import bounds as fb
from edge_testkit.fuzz import cases as fc
from edge_testkit.fuzz import edges as fe
from edge_testkit.fuzz import extras as fx
from edge_testkit.fuzz import judge as fj
from edge_testkit.fuzz import nested as fn
from edge_testkit.fuzz import ollama as fo
from edge_testkit.fuzz import stored as fst
from edge_testkit.fuzz import strategies as fs

MEMORY_LIMIT_MB = 3072
# Bounded for CI: a fixed seed, no database, a few dozen examples per generator and no
# shrinking (on a broken server every shrink step could cost a whole timeout).
fuzz_settings = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # A server of its own, so that a crash found here fails this module only. A small
    # context bounds whatever generation a fuzzed request may legitimately ask for; one
    # thread keeps answer times steady on a busy machine; the memory cap turns a runaway
    # allocation into a failure here rather than the out-of-memory killer's pick.
    server = start_server(tmp_path_factory.mktemp("fuzz"), "--ctx-size", "256",
                          "--parallel", "2", "--slots",
                          "--threads", os.environ.get(THREADS_ENV, "1"),
                          name="fuzz", memory_limit_mb=MEMORY_LIMIT_MB)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def fuzz_client(fuzz_server: RunningServer) -> Iterator[httpx.Client]:
    with fj.new_client(fuzz_server.base_url) as client:
        yield client


def check(server: RunningServer, client: httpx.Client, case: fs.Case) -> None:
    result = fj.exchange(client, case)
    if result.failure is None:
        return
    code = server.process.poll()
    state = "" if code is None else f" (the server exited with {code})"
    pytest.fail(f"{result.failure}{state} after {result.seconds:.1f}s: {case.method} "
                f"{case.path}\n"
                f"body: {case.excerpt()}\nanswer: {result.detail[:300]!r}", pytrace=False)


@settings(fuzz_settings, max_examples=200)
@given(case=fs.request_cases(fs.COMPLETIONS))
def test_fuzz_completions(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                          case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=200)
@given(case=fs.request_cases(fs.CHAT))
def test_fuzz_chat(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                   case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=100)
@given(case=fs.request_cases(fs.NATIVE))
def test_fuzz_native_completion(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                                case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=100)
@given(case=fs.request_cases(fs.RESPONSES))
def test_fuzz_responses(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                        case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=120)
@given(case=fs.request_cases(fs.MESSAGES))
def test_fuzz_messages(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                       case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=40)
@given(case=fn.nested_tool_cases())
def test_fuzz_nested_tool_inputs(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                                 case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=100)
@given(case=fs.request_cases(fs.EMBEDDINGS))
def test_fuzz_embeddings(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                         case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=60)
@given(case=fc.schema_cases())
def test_fuzz_schemas(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                      case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=150)
@given(case=fc.broken_json_cases())
def test_fuzz_broken_json(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                          case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=150)
@given(case=fo.ollama_cases())
def test_fuzz_ollama(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                     case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=40)
@given(case=fb.bound_cases())
def test_fuzz_memory_bounds(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                            case: fs.Case) -> None:
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=80)
@given(case=st.one_of(fx.extra_cases(), fst.stored_cases(), fo.model_file_cases()))
def test_fuzz_routes_beside_generation(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                                       case: fs.Case) -> None:
    """Rerank (refused: the model is no reranker), stored Responses by stored and junk ids,
    /api/create and /api/blobs with junk, /slots and /tokenize with_pieces."""
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=30)
@given(case=st.one_of(fo.long_modelfile_cases(), fo.big_blob_cases()))
def test_fuzz_long_modelfiles_and_big_blobs(fuzz_server: RunningServer,
                                            fuzz_client: httpx.Client, case: fs.Case) -> None:
    """Modelfiles about as long as `modelfile` may be (thousands of comment, odd, FROM
    or PARAMETER lines), and uploads of a few MiB, on the capped server."""
    check(fuzz_server, fuzz_client, case)


@settings(fuzz_settings, max_examples=24)
@given(case=fst.chained_extras_cases())
def test_fuzz_chained_responses_with_large_extras(fuzz_server: RunningServer,
                                                  fuzz_client: httpx.Client,
                                                  case: fs.Case) -> None:
    """Chains of stored Responses whose items carry up to 7.5 MB of unknown fields, on
    the server whose address space is capped: each answer is one the server may give,
    and the server stays up (a chain that copied its fields into every record would
    outgrow the cap)."""
    check(fuzz_server, fuzz_client, case)


@pytest.fixture(scope="module")
def edge_setting(fuzz_server: RunningServer) -> tuple[dict[str, Any], fe.ModelLimits]:
    # The fields from the server's own request schemas, n_ctx and n_vocab from its model.
    return fe.read_spec(fuzz_server.base_url), fe.read_limits(fuzz_server.base_url)


@pytest.mark.parametrize("door", fe.DOORS)
def test_fuzz_edge_values(fuzz_server: RunningServer, fuzz_client: httpx.Client,
                          edge_setting: tuple[dict[str, Any], fe.ModelLimits],
                          door: str) -> None:
    """Every numeric field of the door takes an edge value (0, -1, 2^31, 2^63, n_ctx±1,
    n_vocab±1, 5e-324, 1e309, "NaN", ...) and every edge value goes into a field, on a
    server whose address space is capped: each answer is one the server may give."""
    spec, limits = edge_setting
    cases = fe.covering_cases(spec, limits, door, rounds=3)
    assert cases, f"no numeric field found for {door}"
    for case in cases:
        check(fuzz_server, fuzz_client, case)
        if case.kind.endswith("keep_alive"):
            # keep_alive 0 unloads the model: it loads again here, outside the time
            # limit of an answer (a load measures decode steps: slow on a busy machine).
            fuzz_client.post("/api/generate", timeout=180, json={
                "model": fs.MODEL, "prompt": "", "stream": False})


@pytest.mark.parametrize("separator", ["\n", "\r\n", "\r"])
def test_judge_splits_stream_lines_at_cr_lf_only(separator: str) -> None:
    """U+0085, U+2028 and U+2029 may stand unescaped in a JSON string of a stream line:
    they end no line (str.splitlines() would split there and call the line broken)."""
    text = "a\u0085b\u2028c\u2029d\x1ce"
    ndjson = separator.join(json.dumps(line, ensure_ascii=False) for line in [
        {"response": text, "done": False}, {"response": "", "done": True}]) + separator
    assert fj.judge(200, "application/x-ndjson", ndjson.encode(), "/api/generate") is None
    sse = separator.join(f"data: {json.dumps(event, ensure_ascii=False)}{separator}"
                         for event in [{"choices": [{"text": text}]}]) + "data: [DONE]"
    assert fj.judge(200, "text/event-stream", sse.encode(), fs.COMPLETIONS) is None
    assert fj.judge(200, "application/json", b'{"choices": [NaN]}', fs.COMPLETIONS) \
        == "200 answer is not JSON"


def test_judge_reads_the_answers_of_routes_beside_generation() -> None:
    """Bodiless HEAD and 201 answers, /api/create's stream, a deletion, bare lists and
    /slots' 503 are answers; a 5xx of any other kind stays a failure."""
    busy = (b'{"error":{"message":"no slot available","type":"unavailable_error",'
            b'"param":null,"code":"no_slot_available"}}')
    assert fj.judge(503, "application/json", busy, fx.SLOTS, "GET") is None
    assert fj.judge(404, "", b"", fo.BLOBS, "HEAD") is None
    assert fj.judge(500, "", b"", fo.BLOBS, "HEAD") == "HTTP 500"
    assert fj.judge(201, "", b"", fo.BLOBS) is None
    assert fj.judge(200, "application/x-ndjson", b'{"status":"writing"}\n{"status":"success"}',
                    fo.CREATE) is None
    assert fj.judge(200, "application/json", b'{"id":"r","deleted":true}', fst.STORED,
                    "DELETE") is None
    assert fj.judge(200, "application/json", b'[{"index":0,"score":1.0}]', "/rerank") is None
    assert fj.judge(200, "application/json", b'{"data":[]}', fst.INPUT_ITEMS, "GET") is None
    assert fj.judge(500, "application/json", busy.replace(b"no_slot", b"x"), fx.SLOTS,
                    "GET") == "HTTP 500"


def test_server_serves_after_fuzzing(fuzz_server: RunningServer) -> None:
    assert fj.server_problem(fuzz_server.base_url) is None
    log = fuzz_server.log_text()
    if "Traceback" in log:
        pytest.fail("the server logged a traceback:\n" + log[log.index("Traceback"):][:3000],
                    pytrace=False)
