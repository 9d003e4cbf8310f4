"""Draft tokens from a draft model: a small model of the target's vocabulary (SmolLM2-135M
beside SmolLM2-1.7B, Qwen2.5-0.5B beside Qwen2.5-7B) guesses the next tokens of every
generating sequence greedily, and the target verifies them in its next step as it
verifies lookups (lookup_draft.py): each drafted row is sampled with the choice's own
sampler and kept while the sampled token equals the draft. So the text keeps the
target's distribution exactly at any temperature; a draft only decides how many tokens
one target step yields (acceptance is that of sampling equality, which at a high
temperature is below what rejection sampling with both distributions would keep).

The draft model holds a KV stream per target slot (same sequence ids) and keeps books
of the tokens each holds; before drafting, each stream is brought to the target's
tokens by their common prefix (a cut, then the missing tokens evaluated: a new prompt at
most CATCH_UP_TOKENS a step, so a long prompt never stalls a step, and the sequence
drafts once caught up). Its failures only cost drafts: a decode that fails empties the
streams and the step drafts nothing.

What a depth costs: the target's step of that many rows (its measured step cost) plus
that many draft decodes, whose cost is the draft model's own step cost, measured once
per machine as the target's is (backend/measure/step_cost.py), or where it could not be
measured the target's scaled by the draft's share of its weight bytes (a guess: small
models' decodes cost more than their bytes say, a 0.5B Qwen's about as much as a 1.5B's
on two cores). Measured once, not timed live: the depth shapes the batch, and live
timings would let the same seed write a different text on a second run
(lookup_draft.py, Numerics).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel, ModelLoadError
from edge_server.engine.backend.measure.step_cost import StepCost, load_or_measure
from edge_server.engine.kv.prompt_store import common_prefix
from edge_server.engine.sampling.lookup_draft import DraftCounts

log = logging.getLogger(__name__)

CATCH_UP_TOKENS = 256  # prompt tokens a stream catches up by per step, at most
# llama-server's check: vocabularies may differ by this many (added) tokens at the end.
MAX_VOCAB_DIFFERENCE = 128
_FIRST_TOKENS_SKIPPED = 5  # llama-server too: special tokens differ between conversions
_RATE_DECAY = 0.8
START_RATE = 0.6  # a sequence's rates before its first drafts were checked


@dataclass
class DraftRates:
    """How often a sequence's first drafted token was sampled, and a further one once the
    one before it was."""

    first: float = START_RATE
    run: float = START_RATE
    proposed: list[int] = field(default_factory=list)  # this step's drafts

    @property
    def pair(self) -> tuple[float, float]:
        return self.first, self.run

    def observe(self, sampled: list[int]) -> int:
        """Updates the rates from the tokens sampled this step; returns the drafts kept."""
        kept = 0
        for i, (guess, token) in enumerate(zip(self.proposed, sampled, strict=False)):
            hit = guess == token
            if i == 0:
                self.first = _RATE_DECAY * self.first + (1 - _RATE_DECAY) * hit
            else:
                self.run = _RATE_DECAY * self.run + (1 - _RATE_DECAY) * hit
            if not hit:
                break
            kept += 1
        self.proposed = []
        return kept


class DraftModel:
    """A draft model loaded beside a target, with a KV stream per target slot."""

    def __init__(self, path: Path, target: LlamaModel, settings: ContextSettings,
                 cost_share: float | None = None) -> None:
        self.path = path
        self.model = LlamaModel(path, ContextSettings(
            n_ctx=target.n_ctx_seq, n_seq_max=target.n_seq_max, n_batch=settings.n_batch,
            n_threads=settings.n_threads, n_gpu_layers=settings.n_gpu_layers,
            repack=settings.repack, flash_attn=settings.flash_attn, rollback=0))
        try:
            self._check(target)
        except BaseException:
            self.model.close()
            raise
        self.n_vocab = min(self.model.vocab.n_tokens, target.vocab.n_tokens)
        self.cached: list[list[int]] = [[] for _ in range(self.model.n_seq_max)]
        self._batch = DecodeBatch(self.model.n_batch)
        target_bytes = max(target.buffer_bytes.get("weights", 0), 1)
        # A draft decode's cost per one of the target's: given, else measured (measure),
        # else by weight bytes.
        self.given_share = cost_share
        self.byte_share = self.model.buffer_bytes.get("weights", 0) / target_bytes
        self.cost: StepCost | None = None
        self.counts = DraftCounts()
        log.info("draft model %s: %.0f%% of the target's weight bytes", path.name,
                 100 * self.byte_share)

    @property
    def name(self) -> str:
        """What a request's `draft_model` (LM Studio's) calls it: its file's name."""
        return self.path.name.removesuffix(".gguf")

    def _check(self, target: LlamaModel) -> None:
        mine, theirs = self.model.vocab, target.vocab
        name = self.path.name
        if not self.model.memory_kind.cuts_anywhere:
            raise ModelLoadError(f"draft model {name}: its memory cannot be cut back to "
                                 "the target's tokens (a recurrent or sliding-window "
                                 "model); choose a transformer")
        if abs(mine.n_tokens - theirs.n_tokens) > MAX_VOCAB_DIFFERENCE or (
                mine.bos, mine.eos) != (theirs.bos, theirs.eos):
            raise ModelLoadError(f"draft model {name}: its vocabulary is not the target's "
                                 f"({mine.n_tokens} tokens against {theirs.n_tokens})")
        common = min(mine.n_tokens, theirs.n_tokens)
        for token in range(_FIRST_TOKENS_SKIPPED, common):
            if mine.pieces[token] != theirs.pieces[token]:
                raise ModelLoadError(f"draft model {name}: token {token} differs from the "
                                     "target's: its vocabulary is not the target's")
        if self.model.n_ctx_seq < target.n_ctx_seq:
            raise ModelLoadError(f"draft model {name}: its context ({self.model.n_ctx_seq}) "
                                 f"is shorter than the target's ({target.n_ctx_seq})")

    @property
    def held_bytes(self) -> int:
        """What the model budget charges for it: weights, KV streams, compute buffers."""
        return self.model.held_bytes()

    @property
    def anonymous_bytes(self) -> int:
        """Its share of the memory account: all it holds but the mapped file's pages
        (those are counted as file-backed)."""
        b = self.model.buffer_bytes
        copied = max(0, b.get("weights", 0) - b.get("weights_mapped", 0))
        return b.get("kv_cache", 0) + b.get("compute", 0) + copied

    def measure(self, cost_file: Path | None) -> None:
        """On the engine thread, before serving: the draft model's step cost (read from
        `cost_file` once measured), unless its share was given."""
        if self.given_share is not None:
            return
        try:
            self.cost = load_or_measure(self.model, cost_file)
        except Exception:  # priced by its bytes then
            log.exception("could not measure the draft model's step cost")
        if self.cost is None:
            log.warning("the draft model's step cost was not measured: priced at its "
                        "share of the target's weight bytes")

    def step_seconds(self, sequences: int, target_step: float) -> float:
        """What one draft decode of one row per sequence costs; `target_step`: the
        target's step of the same shape."""
        if self.given_share is not None:
            return target_step * self.given_share
        if self.cost is not None:
            return self.cost.seconds(sequences, sequences)
        return target_step * self.byte_share

    def propose(self, wanted: list[tuple[int, list[int], dict[int, float]]],
                depth: int) -> list[list[int]]:
        """Up to `depth` greedy drafts for each (sequence id, its tokens so far, its logit
        bias); [] for a sequence still catching up or too close to its context's end."""
        rows = self._catch_up(wanted, depth)
        drafts: list[list[int]] = [[] for _ in wanted]
        if not rows:
            return drafts
        for step in range(depth):
            for i, row in rows.items():
                drafts[i].append(self._greedy(row, wanted[i][2]))
            if step == depth - 1:
                break
            batch = self._batch
            batch.clear()
            for i in rows:
                seq_id = wanted[i][0]
                rows[i] = batch.add(drafts[i][-1], len(self.cached[seq_id]), seq_id,
                                    logits=True)
            if not self._decode(batch):
                return [[] for _ in wanted]
            for i in rows:
                self.cached[wanted[i][0]].append(drafts[i][-1])
        return drafts

    def _catch_up(self, wanted: list[tuple[int, list[int], dict[int, float]]],
                  depth: int) -> dict[int, int]:
        """Brings each stream to its sequence's tokens; returns, for those caught up, the
        batch row whose logits give the first draft."""
        batch = self._batch
        batch.clear()
        rows: dict[int, int] = {}
        budget = CATCH_UP_TOKENS
        for i, (seq_id, tokens, _) in enumerate(wanted):
            if len(tokens) + depth > self.model.n_ctx_seq:
                continue
            held = self.cached[seq_id]
            # Mostly the stream is a prefix of the tokens (its drafts all kept): one
            # list compare in C, not a walk over the whole context in Python a step.
            same = len(held) <= len(tokens) and tokens[: len(held)] == held
            keep = len(held) if same else common_prefix(held, tokens)
            keep = min(keep, len(tokens) - 1)  # the last token's logits are wanted
            if keep < len(held):
                if not self.model.seq_remove(seq_id, keep, -1):
                    self.model.seq_clear(seq_id)
                    keep = 0
                del held[keep:]
            missing = tokens[keep:]
            if any(t < 0 for t in missing):  # an image: the draft model reads text only
                continue
            take = min(len(missing), budget, batch.free)
            if take <= 0:
                continue
            budget -= take
            last = batch.add_span(missing[:take], keep, seq_id, logits_last=take == len(missing))
            held.extend(missing[:take])
            if take == len(missing):
                rows[i] = last
        if batch.size and not self._decode(batch):
            return {}
        return rows

    def _decode(self, batch: DecodeBatch) -> bool:
        status = self.model.decode(batch)
        if status == 0:
            return True
        log.error("the draft model's llama_decode failed (%d): its streams are emptied", status)
        for seq_id, held in enumerate(self.cached):
            self.model.seq_clear(seq_id)
            held.clear()
        return False

    def _greedy(self, row: int, bias: dict[int, float]) -> int:
        logits = self.model.logits_row(row)[: self.n_vocab]
        if bias:
            logits = logits.copy()
            ids = np.fromiter((t for t in bias if t < self.n_vocab), dtype=np.int64)
            logits[ids] += np.fromiter((bias[int(t)] for t in ids), dtype=np.float32)
        return int(np.argmax(logits))

    def close(self) -> None:
        self.model.close()


def requested_draft_problem(drafter: DraftModel | None, name: str, model_id: str,
                            draft: bool = True) -> str | None:
    """Why a request's `draft_model` (LM Studio's per-request draft model) cannot be
    honoured, or None: it must name the draft model this model was loaded with."""
    if not draft:
        return "a request cannot name a draft model and ask for no drafting (`draft: false`)"
    if drafter is None:
        return (f"{model_id} has no draft model (start the server with --model-draft, or "
                "give its registry entry a draft)")
    if name.removesuffix(".gguf") != drafter.name:
        return f"{model_id} drafts with {drafter.name}, not {name}"
    return None
