"""llama-server's names for what this server reports in its shapes (/props, the native
/completion): a sampler's settings and a request's timings."""

from __future__ import annotations

from typing import Any

from edge_server.engine.sampling.chain import SamplingParams


def sampler_json(params: SamplingParams) -> dict[str, Any]:
    """A sampler's settings as llama-server's `generation_settings` names them."""
    return {
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "repeat_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "mirostat": 0 if not params.uses_mirostat else 2,
        "mirostat_tau": params.mirostat_target or 5.0,
        "mirostat_eta": params.mirostat_lr or 0.1,
        "seed": -1 if params.seed is None else params.seed,  # -1: a new seed per request
        "ignore_eos": params.ignore_eos,
        "grammar": params.grammar or "",
    }


def timings_json(*, cached: int, prompt: int, prompt_s: float, predicted: int,
                 predicted_s: float, drafted: int = 0, draft_accepted: int = 0
                 ) -> dict[str, float]:
    """llama-server's `timings`: prompt tokens evaluated (not read from the cache) and
    the time to the first token; tokens generated and the time after the first; where
    drafts were verified (lookups or a draft model), how many and how many were kept."""
    def per(n: int, seconds: float) -> tuple[float, float]:
        ms = seconds * 1000
        return (ms / n if n else 0.0), (n / seconds if n and seconds > 0 else 0.0)

    prompt_n = max(prompt - cached, 0)
    prompt_per_token, prompt_per_second = per(prompt_n, prompt_s)
    predicted_per_token, predicted_per_second = per(predicted, predicted_s)
    return {
        "cache_n": cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_s * 1000,
        "prompt_per_token_ms": prompt_per_token,
        "prompt_per_second": prompt_per_second,
        "predicted_n": predicted,
        "predicted_ms": predicted_s * 1000,
        "predicted_per_token_ms": predicted_per_token,
        "predicted_per_second": predicted_per_second,
        **({"draft_n": drafted, "draft_n_accepted": draft_accepted} if drafted else {}),
    }
