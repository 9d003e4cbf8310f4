"""Server options from flags, environment variables and a TOML file.

Precedence, lowest to highest: built-in defaults < TOML file (`--config` or
EDGE_SERVER_CONFIG) < environment variables EDGE_SERVER_<OPTION> < command-line flags.
Every option is declared once below; the flags, their --help text and the variable
names are generated from that declaration, so they cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "EDGE_SERVER_"
# What the embedded model is served from (default_conversion.py).
DEFAULT_MODEL_QUANTS = ["auto", "q8_0", "packaged"]
# llama-server's KV cache types (engine/backend/llama_model.py KV_CACHE_TYPES).
KV_CACHE_TYPE_NAMES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


def default_models_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "edge-server" / "models"


def _opt(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, list):
        return field(default_factory=list, metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ServeOptions:
    host: str = _opt("127.0.0.1", "address to listen on")
    port: int = _opt(8080, "port to listen on")
    model: str | None = _opt(
        None, "GGUF file or registry model id served by default and loaded at start: the "
        "alias `default` names it and /v1/models lists it first (default: the embedded "
        "SmolLM2-135M-Instruct)")
    model_id: str | None = _opt(None, "id clients pass as `model` for --model PATH "
                                "(default: the file name without .gguf)")
    default_model_quant: str = _opt(
        "auto", "what the embedded SmolLM2-135M-Instruct is served from: auto times its "
        "packaged Q4_1 file against its Q8_0 conversion once on this machine's kernels and "
        "serves the faster; q8_0 converts the packaged file to Q8_0 once, into "
        "$XDG_CACHE_HOME/edge-server/default-model (the packaged file serves where the "
        "conversion fails); packaged serves that file as it is", choices=DEFAULT_MODEL_QUANTS)
    serve_unknown_models: bool = _opt(False, "serve requests naming a model this server "
                                      "does not know with the default model (their answer's "
                                      "`model` says which answered), for tools that hard-code "
                                      "a name (`claude-…`, `gpt-4o`); Ollama's /api/* still "
                                      "answer 404", action="store_true")
    registry: Path | None = _opt(None, "model registry TOML (default: registry.toml in the "
                                 "models directory, else the project's models/registry.toml)")
    models_dir: Path | None = _opt(None, "where pulled models live (default: "
                                   "$XDG_DATA_HOME/edge-server/models)")
    min_free_disk_mb: int = _opt(1024, "free disk a pull must leave in the models "
                                 "directory: a pull that would leave less is refused (507) "
                                 "before it starts, and stops when the disk fills during it")
    ctx_size: int = _opt(0, "tokens one request may use, prompt plus completion (Ollama's "
                         "num_ctx), at most the model's training context; each slot has a "
                         "KV stream of that many cells, resident from load (default: the "
                         "training context, as far as a 32nd of --memory-budget-mb holds "
                         "--parallel streams; at least 2,048)")
    threads: int = _opt(0, "CPU threads (default: all cores)")
    adaptive_threads: str = _opt("off", "on: time decode steps on all --threads and on one "
                                 "fewer, and use the faster per batch size (for machines busy "
                                 "with other work); off: always --threads",
                                 choices=["on", "off"])
    parallel: int = _opt(8, "requests decoded together in one batch, per model")
    draft_max: int = _opt(-1, "tokens a sequence may draft per step from its own prompt and "
                          "output (prompt lookup decoding, at most 16), verified by sampling; "
                          "drafted rows' logits come from multi-row kernels, so greedy text "
                          "can part from undrafted decoding after some tokens (a request's "
                          "`draft: false` avoids it). Steps draft only where this machine's "
                          "measured step cost says it pays (0: off; default: 15 where "
                          "the model runs on the CPU alone, 0 with a GPU or --rpc)")
    model_draft: Path | None = _opt(
        None, "draft model GGUF for the default model (llama-server's --model-draft): a "
        "small model of its vocabulary (SmolLM2-135M beside SmolLM2-1.7B) whose greedy "
        "guesses the model verifies by sampling, as it verifies lookups, so the text keeps "
        "the model's distribution; a step drafts with it where its measured cost says that "
        "yields more tokens per second than lookups or no drafts (up to --draft-max)")
    draft_min: int = _opt(0, "rows a step drafts at least, paying or not, wherever a lookup "
                          "or --model-draft has a guess (llama-server's --draft-min; at most "
                          "--draft-max; drafting stays on where the step cost could not be "
                          "measured); 0: drafts only where the measured cost says they pay")
    draft_model_cost: float = _opt(
        -1.0, "what one decode of --model-draft costs, as a share of one of the model's "
        "(0 to 1; -1: the share of the model's weight bytes it reads, as CPU decoding costs)",
        )
    stream_interval_ms: float = _opt(15.0, "after a request's first token, its tokens go "
                                     "to the HTTP layer at most this often, each still its "
                                     "own streamed event (a wake-up per token cost a 2-core "
                                     "CPU up to a tenth of its tokens/s); 0: every decode step's "
                                     "tokens at once")
    max_queue: int = _opt(64, "requests that may wait for a slot before a 429")
    queue_timeout: float = _opt(120.0, "seconds a request may wait for a slot before a 503")
    mmproj: Path | None = _opt(None, "multimodal projector GGUF for the default model (from "
                               "--model): it then reads images (`images`, `image_url`), "
                               "audio (`input_audio`, /v1/audio/transcriptions) or both, "
                               "as the projector's encoders do")
    image_urls: str = _opt("off", "http(s) image URLs in requests: on fetches them "
                           "(--image-url-timeout, --max-image-mb; public addresses only "
                           "unless --image-url-networks), off refuses them (data URLs only: "
                           "offline boxes)", choices=["on", "off"])
    image_url_timeout: float = _opt(10.0, "seconds one image URL fetch may take in all "
                                    "(resolving, connecting, redirects, the whole body)")
    image_url_networks: list[str] = _opt(
        [], "network (CIDR, e.g. 127.0.0.1/32 or 10.0.0.0/8; repeatable) that image URLs may "
        "point into although it is private, loopback or link-local (refused by default)",
        action="append")
    max_images: int = _opt(8, "images one request may carry")
    max_image_mb: float = _opt(20.0, "largest image file accepted, in MiB")
    max_image_pixels: int = _opt(25_000_000, "largest image accepted, in pixels (width x "
                                 "height); images over 2048 pixels a side are scaled down")
    max_audio_seconds: float = _opt(120.0, "longest audio clip accepted, in seconds (a "
                                    "Whisper-style encoder makes 750 prompt tokens of each "
                                    "30 s)")
    max_audio_mb: float = _opt(25.0, "largest audio file accepted, in MiB")
    lora: list[str] = _opt([], "LoRA adapter GGUF for the default model, FILE or FILE:SCALE "
                           "(repeatable, at most 16; scale 1 unless given): requests name "
                           "adapters by id in `lora` (GET /lora-adapters lists them); those "
                           "that name none get these scales", action="append")
    lora_init_without_apply: bool = _opt(False, "load --lora adapters at scale 0: applied "
                                         "only to requests that name them, or after POST "
                                         "/lora-adapters", action="store_true")
    chat_template_file: Path | None = _opt(
        None, "Jinja chat template overriding the GGUF file's, for the default model")
    n_gpu_layers: int = _opt(-1, "layers offloaded to a GPU backend (default: all; 0: CPU)")
    repack: str = _opt("auto", "CPU weights repacked for AMX/AVX kernels: auto (all, unless a "
                       "one-time probe shows this machine's AMX kernels crash: then the AVX "
                       "repacked kernels alone, or none where those crash too), on, off",
                       choices=["auto", "on", "off"])
    flash_attn: str = _opt("auto", "llama.cpp's flash attention: auto (on CPU-only builds, "
                           "on for attention heads of 128 or wider and off for narrower ones, "
                           "whose CPU kernel is slow on batches spanning several sequences; "
                           "llama.cpp's choice with a GPU backend), on, off",
                           choices=["auto", "on", "off"])
    cache_type_k: str = _opt("f16", "KV cache type of keys (llama-server's --cache-type-k); "
                             "q8_0 halves the KV cache's memory", choices=KV_CACHE_TYPE_NAMES)
    cache_type_v: str = _opt("f16", "KV cache type of values; a quantized one turns flash "
                             "attention on (llama.cpp needs it), and --flash-attn off with "
                             "one is refused", choices=KV_CACHE_TYPE_NAMES)
    rpc: list[str] = _opt([], "llama.cpp rpc-server HOST:PORT that holds model layers too "
                          "(repeatable or comma-separated, at most 16; needs llama.cpp built "
                          "with RPC, see docs/deployment.md)", action="append")
    truncation: str = _opt("disabled", "a prompt that outgrows the context: disabled (a 400, "
                           "context_length_exceeded), auto (a chat's oldest whole turns are "
                           "dropped, system messages and the latest turn kept; a raw prompt "
                           "keeps its head and tail); requests may choose for themselves "
                           "(`truncation`, Ollama's `truncate`)", choices=["disabled", "auto"])
    default_max_tokens: int = _opt(-1, "tokens an answer may take when its request sets no "
                                   "bound (no max_tokens, max_output_tokens, n_predict or "
                                   "num_predict); -1: the room its context leaves")
    max_answer_seconds: float = _opt(240.0, "an answer whose request sets no bound ends with "
                                     "finish_reason length this many seconds after it "
                                     "arrived, so it cannot outlast a client's timeout on a "
                                     "slow machine (0: no time ceiling)")
    prompt_cache_mb: int = _opt(256, "host RAM for prompt prefixes evicted from the KV cache, "
                                "also saved to the models directory at unload and shutdown "
                                "(0: off)")
    state_dir: Path | None = _opt(None, "where the server keeps what it writes besides "
                                  "models: the Responses store (default: the models "
                                  "directory; where that is not writable, Responses are "
                                  "not stored)")
    response_store_days: float = _opt(30.0, "stored Responses (`store`, "
                                      "`previous_response_id`) unused this many days are "
                                      "deleted (0: store none)")
    response_store_count: int = _opt(10_000, "most Responses stored for each API key (for "
                                     "all, without keys); a key's least recently used go "
                                     "first, never another key's (0: store none)")
    response_store_mb: float = _opt(256.0, "most MiB of stored Responses for each API key "
                                    "(for all, without keys); a key's least recently used "
                                    "go first, never another key's (0: store none)")
    keep_alive: float = _opt(300.0, "seconds a model stays loaded unused (-1: forever); the "
                             "default model is loaded again on its next request")
    memory_budget_mb: int = _opt(0, "memory for loaded models: weights, KV streams and "
                                 "compute buffers as llama.cpp allocates them; least recently "
                                 "used idle models are unloaded to make room, and a model that "
                                 "cannot fit is refused; the KV streams of a model's default "
                                 "context take at most a 32nd of it (default: 75% of RAM)")
    api_key: list[str] = _opt([], "accepted API key (repeatable); requests then need "
                              "`Authorization: Bearer KEY`", action="append")
    api_key_file: Path | None = _opt(None, "file with one accepted API key per line")
    admin_api_key: list[str] = _opt([], "API key that may also manage models (repeatable): "
                                    "pull, copy, delete, unload with keep_alive 0, load by a "
                                    "GET; other keys then get a 403 for those",
                                    action="append")
    admin_api_key_file: Path | None = _opt(None, "file with one admin API key per line")
    allowed_hosts: list[str] = _opt([], "Host header names served besides loopback ones "
                                    "and --host, when no API key is set (repeatable or "
                                    "comma-separated; * allows any): other names get a 403, "
                                    "which stops DNS rebinding from web pages",
                                    action="append")
    send_timeout: float = _opt(120.0, "seconds a connection may stay behind (holding "
                               "written output its client has not taken, however it "
                               "drains meanwhile) before it is closed (its slot, queue "
                               "place and model are free from when the engine finished; "
                               "the rest of the answer waits in memory until then)")
    send_buffer_mb: float = _opt(256.0, "MiB of answers waiting for their readers, all "
                                 "connections together; over it, the connections longest "
                                 "behind are closed first")
    limit_concurrency: int = _opt(512, "most connections, and most requests, served at "
                                  "once; one over it is answered 503 and closed")
    drain_timeout: float = _opt(30.0, "seconds SIGTERM waits for requests in flight; "
                                "meanwhile /health and new requests answer 503")
    replica_name: str | None = _opt(None, "name sent in the X-Edge-Replica header of every "
                                    "answer, to tell replicas apart behind a load balancer "
                                    "(default: hostname:port)")
    slots: bool = _opt(False, "serve GET /slots, llama-server's read-only view of each "
                       "slot (off: 501)", action="store_true")
    no_webui: bool = _opt(False, "do not serve the chat page at / (the API is unchanged)",
                          action="store_true")
    cors_origins: list[str] = _opt([], "web origins (scheme://host[:port], or * for any) whose "
                                   "pages may call the API from a browser (repeatable or "
                                   "comma-separated); a browser request from any other "
                                   "origin but the server's own gets a 403",
                                   action="append")
    ssl_certfile: Path | None = _opt(None, "TLS certificate chain (PEM): serve https (with "
                                     "--ssl-keyfile)")
    ssl_keyfile: Path | None = _opt(None, "TLS private key (PEM) of --ssl-certfile")
    max_body_mb: float = _opt(8.0, "largest request body accepted, in MiB; larger gets a 413")
    watchdog_seconds: float = _opt(30.0, "an engine step stalled this long makes /health "
                                   "answer 503 (and stops systemd watchdog pings)")
    log_level: str = _opt("info", "critical, error, warning, info or debug",
                          choices=["critical", "error", "warning", "info", "debug"])
    config: Path | None = _opt(None, "TOML file of these options (keys as the flag names, "
                               "with - or _)")

    def __post_init__(self) -> None:
        if not self.send_timeout > 0:
            raise ValueError("--send-timeout must be more than 0 seconds")
        if not 0 <= self.max_answer_seconds <= 86400:
            raise ValueError("--max-answer-seconds must be from 0 to 86400")
        if not 1 <= self.send_buffer_mb <= 1024 * 1024:
            raise ValueError("--send-buffer-mb must be from 1 to 1048576 MiB")
        if not 1 <= self.limit_concurrency <= 1_000_000:
            raise ValueError("--limit-concurrency must be from 1 to 1000000")
        # argparse checks the flag's choices; the variable and the config file are here.
        if self.default_model_quant not in DEFAULT_MODEL_QUANTS:
            raise ValueError("--default-model-quant must be one of "
                             + ", ".join(DEFAULT_MODEL_QUANTS))
        # Repeated flags give lists of comma-separated lists: flatten, and check each.
        networks: list[str] = []
        for item in self.image_url_networks:
            for text in [item] if isinstance(item, str) else item:
                networks += [n.strip() for n in str(text).split(",") if n.strip()]
        for network in networks:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as exc:
                raise ValueError(f"--image-url-networks: {network!r} is not a network "
                                 "(CIDR, such as 127.0.0.1/32)") from exc
        self.image_url_networks = networks
        # `--cors-origins a,b` as docs/configuration.md shows it: one origin per item.
        self.cors_origins = [origin.strip() for item in self.cors_origins
                             for origin in str(item).split(",") if origin.strip()]

    def api_keys(self) -> list[str]:
        return _keys(self.api_key, self.api_key_file)

    def admin_api_keys(self) -> list[str]:
        return _keys(self.admin_api_key, self.admin_api_key_file)


def _keys(given: list[str], file: Path | None) -> list[str]:
    """Keys from the flag's values and from a file of one key per line (# comments)."""
    keys = [k for k in given if k]
    if file is not None:
        lines = file.read_text(encoding="utf-8").splitlines()
        keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return keys


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True,
             "0": False, "false": False, "no": False, "off": False, "": False}


def _coerce(value: Any, annotation: str) -> Any:
    if value is None:
        return None
    if "list" in annotation:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return [str(v) for v in value]
    if annotation.startswith("bool"):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text not in _BOOLEANS:
            raise ValueError(f"{value!r} is not a boolean (true/false, 1/0, yes/no, on/off)")
        return _BOOLEANS[text]
    if "Path" in annotation:
        return Path(str(value)).expanduser()
    if annotation.startswith("int"):
        return int(value)
    if annotation.startswith("float"):
        return float(value)
    return str(value)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per option, documented with its variable name and default."""
    for f in dataclasses.fields(ServeOptions):
        flag = "--" + f.name.replace("_", "-")
        meta = dict(f.metadata)
        helptext = meta.pop("help")
        default = [] if f.default is dataclasses.MISSING else f.default
        helptext += f" [env {env_name(f.name)}; default {default!r}]"
        helptext = helptext.replace("%", "%%")  # argparse formats help with %
        kwargs: dict[str, Any] = {"help": helptext, "default": argparse.SUPPRESS, **meta}
        if "action" not in meta:
            kwargs["type"] = lambda v, a=str(f.type): _coerce(v, a)
        parser.add_argument(flag, **kwargs)


def resolve_options(flags: argparse.Namespace, environ: dict[str, str] | None = None
                    ) -> ServeOptions:
    environ = dict(os.environ if environ is None else environ)
    given = {k: v for k, v in vars(flags).items() if k in _FIELD_TYPES}
    config_path = given.get("config") or (
        Path(environ[env_name("config")]) if env_name("config") in environ else None)
    values: dict[str, Any] = {}
    if config_path is not None:
        with open(config_path, "rb") as fh:
            for key, value in tomllib.load(fh).items():
                name = key.replace("-", "_")
                if name not in _FIELD_TYPES:
                    raise ValueError(f"unknown option {key!r} in {config_path}")
                values[name] = _coerce(value, _FIELD_TYPES[name])
    for name, annotation in _FIELD_TYPES.items():
        if env_name(name) in environ:
            values[name] = _coerce(environ[env_name(name)], annotation)
    values.update(given)
    values["config"] = config_path
    return ServeOptions(**values)


_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(ServeOptions)}
