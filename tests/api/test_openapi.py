"""GET /openapi.json describes every route the app serves, with the request schemas the
server validates with; unknown routes and wrong methods get useful OpenAI-shaped errors."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from conftest import ROOT
from openapi_spec_validator import validate
from pydantic import RootModel
from starlette.routing import Route

from edge_server.api.app import create_app
from edge_server.api.http.errors import ErrorResponse
from edge_server.api.http.metrics import Metrics
from edge_server.api.openapi import OPERATIONS, build_openapi
from edge_server.catalogue.pool import ModelPool
from edge_server.catalogue.spec import ModelSpec


def _app_routes() -> list[Route]:
    """The routes of an app built as `serve` builds it (no model is loaded)."""
    app = create_app(ModelPool([ModelSpec("m", None)]), preload=None, metrics=Metrics())
    return [r for r in app.routes if isinstance(r, Route)]


@pytest.fixture()
def doc(http) -> dict[str, Any]:
    r = http.get("/openapi.json")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def _schema(doc: dict[str, Any], ref: dict[str, str]) -> dict[str, Any]:
    name = ref["$ref"].removeprefix("#/components/schemas/")
    return doc["components"]["schemas"][name]


def test_document_is_valid_openapi(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_route_is_documented(doc: dict[str, Any]) -> None:
    served = {(m, r.path_format) for r in _app_routes() for m in r.methods or () if m != "HEAD"}
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert served - documented == set(), "routes missing from /openapi.json"
    assert documented - served == set(), "documented routes the app does not serve"
    assert ("GET", "/v1/models/{model}") in served
    params = doc["paths"]["/v1/models/{model}"]["get"]["parameters"]
    assert [(p["name"], p["in"]) for p in params] == [("model", "path")]


def test_every_post_has_its_request_schema(doc: dict[str, Any]) -> None:
    posts = [(p, ops["post"]) for p, ops in doc["paths"].items() if "post" in ops]
    assert {p for p, _ in posts} >= {"/v1/completions", "/v1/chat/completions"}
    for path, op in posts:
        model = OPERATIONS[("POST", path)].request
        if model is None:  # Ollama's refused /api/push and file uploads read no JSON
            assert "requestBody" not in op and path in ("/api/push", "/api/blobs/{digest}")
            continue
        [body] = op["requestBody"]["content"].values()  # JSON, or a multipart form
        schema = _schema(doc, body["schema"])
        if issubclass(model, RootModel):  # POST /lora-adapters reads an array (llama-server's)
            assert schema["type"] == "array" and "items" in schema, path
            continue
        # Generated from the model that validates the body: every field, by its JSON name.
        fields = {f.alias or name for name, f in model.model_fields.items()}
        assert set(schema["properties"]) == fields, path
        # `model` is optional where llama-server has it so (the default model); Ollama's
        # copy names `source` and `destination`.
        if path != "/api/copy":
            assert "model" in schema["properties"]
        assert "200" in op["responses"] and "default" in op["responses"]


def _validator(doc: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(root)


def test_request_schemas_match_what_the_server_accepts(doc: dict[str, Any]) -> None:
    completion = _validator(doc, "CompletionRequest")
    for prompt in ("hi", ["a", "b"], [1, 2], [[1], [2]]):
        completion.validate({"model": "m", "prompt": prompt})
    assert completion.is_valid({"prompt": "hi"})  # no model: the default one
    assert not completion.is_valid({"model": "m"})
    assert not completion.is_valid({"model": "m", "prompt": {"a": 1}})
    chat = _validator(doc, "ChatCompletionRequest")
    chat.validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "response_format": {"type": "json_schema",
                                       "json_schema": {"name": "x", "schema": {}}}})
    assert not chat.is_valid({"model": "m", "messages": []})


def test_secured_document_marks_health_open() -> None:
    doc = build_openapi(_app_routes(), secured=True)
    validate(doc)
    assert doc["security"] == [{"bearer": []}]
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert "401" in doc["paths"]["/v1/models"]["get"]["responses"]


# --- unknown routes and wrong methods ---------------------------------------------------

def _error(r) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    assert "Traceback" not in r.text and str(ROOT) not in r.text
    ErrorResponse.model_validate_json(r.text)  # the documented error schema holds
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


def test_unknown_route_lists_the_served_routes(http) -> None:
    r = http.get("/v1/foo")
    assert r.status_code == 404
    error = _error(r)
    assert error["code"] == "unknown_url"
    message = error["message"]
    assert message.startswith("Unknown route GET /v1/foo.")
    for route in ("POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models",
                  "GET /v1/models/{model}", "GET /health", "/openapi.json"):
        assert route in message
    assert "HEAD" not in message


def test_unknown_route_echo_is_bounded(http) -> None:
    r = http.post("/" + "x" * 5000, json={})
    assert r.status_code == 404
    # The list of served routes grows with the server; the echoed path does not.
    short = http.post("/x", json={})
    assert len(_error(r)["message"]) - len(_error(short)["message"]) <= 200
    # The path is echoed cut to 200 characters.
    message = _error(r)["message"]
    assert "/" + "x" * 199 + "…" in message and "x" * 200 not in message


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("DELETE", "/v1/models", "GET"),
    ("POST", "/v1/models/default", "GET"),
    ("GET", "/v1/chat/completions", "POST"),
    ("PUT", "/v1/completions", "POST"),
])
def test_wrong_method_is_405_naming_the_allowed(http, method: str, path: str,
                                                allowed: str) -> None:
    r = http.request(method, path)
    assert r.status_code == 405
    error = _error(r)
    assert error["code"] == "method_not_allowed"
    assert f"Method {method} is not allowed on {path}; it answers {allowed}." == error["message"]
    assert allowed in r.headers["allow"]
