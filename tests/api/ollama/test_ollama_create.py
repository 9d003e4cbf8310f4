"""/api/create (both request shapes), /api/blobs and saved names, through the official
`ollama` Python client on a server of its own (its own models directory, an API key), on
the real default model: created models apply their SYSTEM, TEMPLATE and PARAMETER lines,
an uploaded GGUF serves as a model, and all of it serves again after a restart."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server
from ollama._types import ProgressResponse

from edge_server.catalogue.default_model import default_model_path

KEY = "create-test-key"  # an admin key: making models is management
USER_KEY = "create-test-user-key"  # an ordinary key: may use models, not make them
HI = [{"role": "user", "content": "Hi"}]
GREEDY = {"num_predict": 3, "temperature": 0}
# An Ollama prompt template (ChatML, as SmolLM2's own), and what it renders for a chat.
TEMPLATE = ("{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
            "<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n"
            "{{ .Response }}<|im_end|>\n")
MODELFILE = (f'FROM {DEFAULT_MODEL}\n# an old client\'s request\nSYSTEM "Be Luigi."\n'
             f'PARAMETER num_predict 3\nPARAMETER temperature 0\nPARAMETER stop "<|im_end|>"\n'
             f'TEMPLATE """{TEMPLATE}"""\n')
LUIGI_CHAT = ("<|im_start|>system\nBe Luigi.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
              "<|im_start|>assistant\n")


class Served:
    """The test server, restarted on the same models directory by the last test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = {"EDGE_SERVER_MODELS_DIR": str(tmp / "models")}
        self.server = self.start()

    def start(self) -> RunningServer:
        return start_server(self.tmp, "--admin-api-key", KEY, "--api-key", USER_KEY,
                            "--ctx-size", "2048", "--parallel", "2", name="ollama-create",
                            env=self.env)

    def restart(self) -> None:
        stop_server(self.server)
        self.check_log()
        self.server = self.start()

    def check_log(self) -> None:
        assert "Traceback" not in self.server.log_text(), self.server.log_text()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = Served(tmp_path_factory.mktemp("ollama-create"))
    yield served
    stop_server(served.server)
    served.check_log()


@pytest.fixture()
def oc(served: Served) -> ollama.Client:
    return ollama.Client(host=served.server.base_url, timeout=300,
                         headers={"Authorization": f"Bearer {KEY}"})


@pytest.fixture()
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.server.base_url, timeout=300,
                      headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


def _listed(oc: ollama.Client) -> set[str]:
    return {m.model or "" for m in oc.list().models}


def test_create_from_a_model_with_fields(oc: ollama.Client) -> None:
    done = oc.create(model="mario", from_=DEFAULT_MODEL, system="You are Mario.",
                     parameters={"num_predict": 3, "temperature": 0, "stop": ["!"]})
    assert done.status == "success"
    assert "mario:latest" in _listed(oc)
    shown = oc.show("mario")
    assert 'SYSTEM """You are Mario."""' in (shown.modelfile or "")
    assert "num_predict" in (shown.parameters or "") and '"!"' in (shown.parameters or "")
    # The SYSTEM line is the system prompt, the PARAMETER lines the default options.
    mario = oc.chat(model="mario", messages=HI)
    same = oc.chat(model=DEFAULT_MODEL, options={**GREEDY, "stop": ["!"]},
                   messages=[{"role": "system", "content": "You are Mario."}, *HI])
    assert mario.eval_count == same.eval_count and (mario.eval_count or 0) <= 3
    assert mario.prompt_eval_count == same.prompt_eval_count
    assert mario.message.content == same.message.content
    # A request's own options and system prompt win.
    longer = oc.chat(model="mario", messages=[{"role": "system", "content": "Be brief."}, *HI],
                     options={"num_predict": 1})
    assert longer.eval_count == 1
    # A model made from a made model builds on its Modelfile.
    oc.create(model="mario:fast", from_="mario", parameters={"num_predict": 1})
    fast = oc.show("mario:fast")
    assert "You are Mario." in (fast.modelfile or "")
    assert oc.generate(model="mario:fast", prompt="Hi").eval_count == 1


def test_create_from_a_modelfile_with_a_template(oc: ollama.Client) -> None:
    # The shape before Ollama 0.5 (a Modelfile's text), as older clients send it.
    done = oc._request(ProgressResponse, "POST", "/api/create",
                       json={"name": "luigi", "modelfile": MODELFILE, "stream": False})
    assert done.status == "success"
    shown = oc.show("luigi")
    assert shown.template == TEMPLATE and 'SYSTEM """Be Luigi."""' in (shown.modelfile or "")
    # TEMPLATE renders the prompt as Ollama renders it: the same as a raw request of it.
    history = [*HI, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    chat = oc.chat(model="luigi", messages=history)
    raw = oc.generate(model=DEFAULT_MODEL, prompt=LUIGI_CHAT, raw=True, options=GREEDY)
    assert chat.prompt_eval_count == raw.prompt_eval_count
    assert chat.message.content == raw.response and chat.eval_count == raw.eval_count
    one = oc.generate(model="luigi", prompt="Hi")
    rendered = LUIGI_CHAT.split("<|im_start|>assistant\nHello")[0] + "<|im_start|>assistant\n"
    raw_one = oc.generate(model=DEFAULT_MODEL, prompt=rendered, raw=True, options=GREEDY)
    assert one.prompt_eval_count == raw_one.prompt_eval_count
    assert one.response == raw_one.response
    stream = list(oc.chat(model="luigi", messages=HI, stream=True))
    assert stream[-1].done and stream[-1].done_reason in ("stop", "length")


def test_blob_upload_round_trip(oc: ollama.Client, http: httpx.Client) -> None:
    path = default_model_path()
    digest = oc.create_blob(path)
    assert digest == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert http.head(f"/api/blobs/{digest}").status_code == 200
    assert http.post(f"/api/blobs/{digest}", content=b"GGUF").status_code == 200  # kept
    oc.create(model="uploaded", files={"model.gguf": digest}, parameters={"num_predict": 2})
    listed = {m.model: m for m in oc.list().models}
    assert listed["uploaded:latest"].size == path.stat().st_size
    assert listed["uploaded:latest"].digest == digest.removeprefix("sha256:")
    answer = oc.generate(model="uploaded", prompt="Hi", options={"temperature": 0})
    assert answer.done and answer.eval_count == 2
    # The old shape names a blob in FROM, as older clients rewrote a local file's path.
    old = oc._request(ProgressResponse, "POST", "/api/create", json={
        "model": "uploaded-old", "modelfile": f"FROM @{digest}\nPARAMETER num_predict 1",
        "stream": False})
    assert old.status == "success"
    assert oc.generate(model="uploaded-old", prompt="Hi").eval_count == 1


@pytest.mark.parametrize(("content", "digest", "words"), [
    (b"GGUF" + bytes(64), "sha256:" + "0" * 64, "digest mismatch"),
    (b"not a model", "sha256:" + hashlib.sha256(b"not a model").hexdigest(), "GGUF"),
    (b"GGUF", "sha256:abc", "digest"),
    (b"GGUF", "md5:" + "0" * 32, "digest"),
])
def test_bad_blobs_are_refused_and_not_kept(http: httpx.Client, content: bytes, digest: str,
                                            words: str) -> None:
    r = http.post(f"/api/blobs/{digest}", content=content)
    assert r.status_code == 400 and words in r.json()["error"], r.text
    assert http.head(f"/api/blobs/{digest}").status_code in (400, 404)


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"modelfile": f"FROM {DEFAULT_MODEL}\nADAPTER ./lora.gguf"}, 400, "ADAPTER"),
    ({"modelfile": f"FROM {DEFAULT_MODEL}\nMESSAGE user hi"}, 400, "MESSAGE"),
    ({"modelfile": f"FROM {DEFAULT_MODEL}\nPARAMETER temperature hot"}, 400,
     "parameters.temperature"),
    ({"modelfile": f"FROM {DEFAULT_MODEL}\nPARAMETER nonsense 1"}, 400, "parameters.nonsense"),
    ({"modelfile": f'FROM {DEFAULT_MODEL}\nSYSTEM """open'}, 400, "modelfile"),
    ({"modelfile": f"FROM {DEFAULT_MODEL}\nTEMPLATE {{{{ range .Messages }}}}x{{{{ end }}}}"},
     400, "template"),
    ({"modelfile": "SYSTEM hi"}, 400, "from"),
    ({"modelfile": f"FROM {DEFAULT_MODEL}\n#\nSYSTEM {'x' * 65_537}"}, 400, "line 3: SYSTEM"),
    ({"from": DEFAULT_MODEL, "adapters": {"a.gguf": "sha256:" + "0" * 64}}, 400, "adapters"),
    ({"from": DEFAULT_MODEL, "quantize": "q4_K_M"}, 400, "quantize"),
    ({"from": DEFAULT_MODEL, "messages": [{"role": "user", "content": "x"}]}, 400, "messages"),
    ({"from": DEFAULT_MODEL, "unknown": 1}, 400, "unknown"),
    ({"from": "no-such-model"}, 404, "no-such-model"),
    ({"from": "./model.gguf"}, 400, "upload"),
    ({"files": {"model.gguf": "sha256:" + "1" * 64}}, 400, "upload it first"),
    ({"files": {"a.safetensors": "sha256:" + "1" * 64}}, 400, "files"),
    ({"model": DEFAULT_MODEL, "from": DEFAULT_MODEL}, 409, DEFAULT_MODEL),
    ({"model": "x" * 201, "from": DEFAULT_MODEL}, 400, "200"),
    ({"model": "two words", "from": DEFAULT_MODEL}, 400, "spaces"),
    # Glob characters would make the name answer for every name it matches.
    ({"model": "*", "from": DEFAULT_MODEL}, 400, "`model` must be a model name"),
    ({"model": "claude-*", "from": DEFAULT_MODEL}, 400, "`model` must be a model name"),
    ({"model": "gpt-?", "from": DEFAULT_MODEL}, 400, "`model` must be a model name"),
    ({"model": "[a-z]x", "from": DEFAULT_MODEL}, 400, "`model` must be a model name"),
    ({"model": "a/b/c/d", "from": DEFAULT_MODEL}, 400, "three parts"),
    ({"model": "x:", "from": DEFAULT_MODEL}, 400, "empty"),
])
def test_create_refusals_name_what_is_wrong(http: httpx.Client, body: dict[str, Any],
                                            status: int, words: str) -> None:
    r = http.post("/api/create", json={"model": "refused", **body})
    assert r.status_code == status and words in r.json()["error"], r.text
    assert set(r.json()) == {"error"}


@pytest.mark.parametrize("destination", ["*", "claude-*", "m?", "[ab]", "a b", "x/../y"])
def test_copy_refuses_names_outside_the_grammar(http: httpx.Client, destination: str) -> None:
    r = http.post("/api/copy", json={"source": DEFAULT_MODEL, "destination": destination})
    assert r.status_code == 400 and "`destination` must be a model name" in r.json()["error"]
    # Nothing became a catch-all: a name no model has is still unknown.
    r = http.post("/api/chat", json={"model": "claude-3-opus", "messages": HI, "stream": False})
    assert r.status_code == 404, r.text


def _timed_gets(base_url: str, paths: tuple[str, ...], stop: threading.Event,
                waits: dict[str, list[float]], asking: threading.Event) -> None:
    with httpx.Client(base_url=base_url, timeout=30,
                      headers={"Authorization": f"Bearer {USER_KEY}"}) as client:
        while not stop.is_set():
            for path in paths:
                started = time.monotonic()
                status = client.get(path).status_code
                # A failed answer counts as never answered.
                waits[path].append(time.monotonic() - started if status == 200 else 1e9)
            # Set once a whole round was answered: the caller waits for it, so on a busy
            # machine the measured request cannot end before the asking has begun.
            asking.set()


def test_a_long_modelfile_is_read_at_once_and_the_loop_stays_free(served: Served,
                                                                  http: httpx.Client) -> None:
    """131,000 comment lines (262 KB, the bound on `modelfile`): answered in well under a
    second, while /health and /api/version, asked again and again meanwhile, answer at
    once: the event loop waited on nothing (/api/version is the loop alone; /health is
    allowed what its memory account costs on this machine when nothing else runs)."""
    text = f"FROM {DEFAULT_MODEL}\n" + "#\n" * 131_000
    assert len(text) <= 262_144
    paths = ("/health", "/api/version")
    quiet: dict[str, list[float]] = {p: [] for p in paths}
    during: dict[str, list[float]] = {p: [] for p in paths}
    stop, asking = threading.Event(), threading.Event()
    asker = threading.Thread(target=_timed_gets,
                             args=(served.server.base_url, paths, stop, quiet, asking))
    asker.start()
    assert asking.wait(30), "no quiet round of /health and /api/version was answered"
    time.sleep(0.5)
    stop.set()
    asker.join()
    stop.clear()
    asking.clear()
    asker = threading.Thread(target=_timed_gets,
                             args=(served.server.base_url, paths, stop, during, asking))
    asker.start()
    assert asking.wait(30), "no round of /health and /api/version was answered"
    try:
        started = time.monotonic()
        r = http.post("/api/create", json={"model": "long-modelfile", "modelfile": text,
                                           "stream": False})
        took = time.monotonic() - started
    finally:
        stop.set()
        asker.join()
    assert r.status_code == 200 and r.json() == {"status": "success"}, r.text
    assert took < 1.0, f"the Modelfile took {took:.2f}s"
    assert during["/health"], "no /health answer came while the Modelfile was read"
    assert max(during["/api/version"]) < 0.1, during
    assert max(during["/health"]) < max(quiet["/health"]) + 0.1, (quiet, during)
    assert http.request("DELETE", "/api/delete", json={"model": "long-modelfile"}
                        ).status_code == 200


def test_management_needs_the_key(served: Served) -> None:
    base = served.server.base_url
    assert httpx.post(f"{base}/api/create", json={"model": "k", "from": DEFAULT_MODEL}
                      ).status_code == 401
    assert httpx.post(f"{base}/api/blobs/sha256:{'0' * 64}", content=b"GGUF").status_code == 401
    user = {"Authorization": f"Bearer {USER_KEY}"}
    assert httpx.post(f"{base}/api/create", json={"model": "k", "from": DEFAULT_MODEL},
                      headers=user).status_code == 403
    assert httpx.post(f"{base}/api/blobs/sha256:{'0' * 64}", content=b"GGUF",
                      headers=user).status_code == 403
    assert httpx.post(f"{base}/api/copy", json={"source": DEFAULT_MODEL, "destination": "k"},
                      headers=user).status_code == 403


def test_made_models_and_copies_survive_a_restart(served: Served, oc: ollama.Client) -> None:
    oc.copy("luigi", "luigi-copy")
    oc.copy(DEFAULT_MODEL, "plain-copy")
    oc.copy("uploaded", "uploaded-copy")
    before = oc.generate(model="luigi-copy", prompt="Hi")
    # Deleting: not a model another name stands for; a copy or a made model, gone.
    with pytest.raises(ollama.ResponseError) as used:
        oc.delete("uploaded")
    assert used.value.status_code == 409 and "uploaded-copy" in used.value.error
    for name in ("plain-copy", "mario:fast"):
        assert oc.delete(name).status == "success"
    with pytest.raises(ollama.ResponseError) as gone:
        oc.show("plain-copy")
    assert gone.value.status_code == 404
    served.restart()
    oc = ollama.Client(host=served.server.base_url, timeout=300,
                       headers={"Authorization": f"Bearer {KEY}"})
    listed = _listed(oc)
    assert {"mario:latest", "luigi:latest", "luigi-copy:latest", "uploaded:latest",
            "uploaded-copy:latest", "uploaded-old:latest"} <= listed
    assert "plain-copy:latest" not in listed and "mario:fast" not in listed
    after = oc.generate(model="luigi-copy", prompt="Hi")
    assert after.response == before.response
    assert after.prompt_eval_count == before.prompt_eval_count
    assert "You are Mario." in (oc.show("mario").modelfile or "")
    assert oc.generate(model="uploaded-copy", prompt="Hi").eval_count == 2


def test_a_blob_goes_with_the_last_model_made_from_it(served: Served, http: httpx.Client
                                                      ) -> None:
    digest = "sha256:" + hashlib.sha256(default_model_path().read_bytes()).hexdigest()
    blob = served.tmp / "models" / "blobs" / f"sha256-{digest.removeprefix('sha256:')}"
    assert http.head(f"/api/blobs/{digest}").status_code == 200
    for name in ("uploaded-copy", "uploaded"):  # the copy first: it stands for `uploaded`
        assert http.request("DELETE", "/api/delete", json={"model": name}).status_code == 200
    assert blob.is_file()  # `uploaded-old` is made from it too
    assert http.post("/api/generate", json={"model": "uploaded-old", "prompt": "Hi",
                                            "stream": False}).status_code == 200
    assert http.request("DELETE", "/api/delete", json={"model": "uploaded-old"}
                        ).status_code == 200
    assert not blob.exists() and http.head(f"/api/blobs/{digest}").status_code == 404
