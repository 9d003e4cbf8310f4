"""/metrics counts requests by the route that served them: every route has a label of
its own (its path, parameters by name), and only unknown paths share "other"."""

from __future__ import annotations

import re

import httpx
from conftest import DEFAULT_MODEL


def counted(http: httpx.Client) -> dict[tuple[str, str], float]:
    """edge_server_requests_total by (endpoint, status)."""
    pattern = re.compile(r'^edge_server_requests_total\{endpoint="([^"]*)",status="(\d+)"\} (\S+)$')
    found = {}
    for line in http.get("/metrics").text.splitlines():
        match = pattern.match(line)
        if match:
            found[(match[1], match[2])] = float(match[3])
    return found


def test_every_route_has_its_own_label(http: httpx.Client) -> None:
    before = counted(http)
    answers = {
        "/completion": http.post("/completion", json={
            "model": DEFAULT_MODEL, "prompt": "Hi", "n_predict": 2}),
        "/infill": http.post("/infill", json={"model": DEFAULT_MODEL, "input_prefix": "a",
                                              "input_suffix": "b", "n_predict": 2}),
        "/props": http.get("/props"),
        "/apply-template": http.post("/apply-template", json={
            "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Hi"}]}),
        "/completions": http.post("/completions", json={
            "model": DEFAULT_MODEL, "prompt": "Hi", "max_tokens": 2}),
        "/models/{model}": http.get(f"/models/{DEFAULT_MODEL}"),
        "/v1/models/{model}": http.get(f"/v1/models/{DEFAULT_MODEL}"),
        "other": http.get("/no/such/route"),
    }
    after = counted(http)
    for endpoint, r in answers.items():
        key = (endpoint, str(r.status_code))
        assert after.get(key, 0) == before.get(key, 0) + 1, (key, r.text[:200])
    # The parameter's value makes no label of its own.
    assert not any(DEFAULT_MODEL in endpoint for endpoint, _ in after)
