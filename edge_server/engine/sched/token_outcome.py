"""What one sampled token does to its choice: it ends it (an end-of-generation token, a
stop string, a length, infill's limits) or goes into the choice's next delta."""

from __future__ import annotations

import time

from edge_server.engine.request import ChoiceDelta
from edge_server.engine.sampling.logprobs import TokenLogprob
from edge_server.engine.sched.jobs import Choice, Job


def take_token(job: Job, choice: Choice, token: int, scored: list[TokenLogprob] | None,
               is_eog: bool, n_ctx_seq: int) -> None:
    """`scored`: the token's logprobs, where the request asked for them."""
    request = job.request
    # With a grammar, an end-of-generation token is only sampled once the grammar is
    # complete, so it ends the choice even under ignore_eos.
    if is_eog and (not request.sampling.ignore_eos or choice.sampler.has_grammar):
        job.finish_choice(choice, "stop", [])
        return
    choice.generated += 1
    text = choice.text.push(choice.pieces[token])
    cut = choice.indent.cut_at(text) if choice.indent is not None else None
    if choice.text.stopped:
        job.finish_choice(choice, "stop", [token], text, scored)
    elif cut is not None:
        # Infill's n_indent: the completion left the block; llama-server calls it a limit.
        job.finish_choice(choice, "length", [token], text[:cut], scored)
    elif "\n" in text and job.over_predict_budget(time.monotonic()):
        # Infill's t_max_predict_ms: over time, end at a line's end (as llama-server).
        text += choice.text.finish()
        job.finish_choice(choice, "length", [token], text, scored)
    elif (choice.generated >= request.max_tokens or choice.position + 1 >= n_ctx_seq
          or (request.max_answer_s is not None and job.over_answer_ceiling(time.monotonic()))):
        text += choice.text.finish()
        job.finish_choice(choice, "length", [token], text, scored)
    else:
        choice.next_token = token
        job.outbox.append(ChoiceDelta(choice.index, text, [token], None, scored))
