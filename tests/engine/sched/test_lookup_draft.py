"""Lookup drafting (prompt lookup decoding): drafts are verified by sampling, and what a
request gets agrees with undrafted decoding up to near ties (drafted rows come from
multi-row kernels); forced loops show drafts kept, and every bound (max_tokens,
stop, n, logprobs) holds in the middle of a drafted run. This module's server drafts
wherever a lookup has a guess (`--draft-min 1`); a second server with --draft-max 0 is
the reference."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from conftest import (
    DEFAULT_MODEL,
    RunningServer,
    agree_up_to_near_ties,
    start_server,
    stop_server,
)

from edge_server.engine.backend.measure.step_cost import StepCost
from edge_server.engine.sampling.lookup_draft import (
    STEP_COST_IN_ROWS,
    LookupDraft,
    Reference,
    choose_depth,
)

# The cost drafting assumes where the machine's could not be measured (in rows' worth):
# a fixed share plus the rows, the same at one sequence and at eight.
_FALLBACK = StepCost.fixed_model(STEP_COST_IN_ROWS)


def step_cost(rows: int) -> float:
    return _FALLBACK.seconds(1, rows)

FORCED = 28  # a token id; logit_bias +100 makes it the only choice at every step
LISTS = [
    "Count from one: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,",
    "Write a long list of people, with their name, age and city, as JSON.",
    "red blue red blue red blue red blue red blue red blue red",
]


@pytest.fixture(scope="module")
def no_draft(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("nodraft"), "--parallel", "2",
                          "--draft-max", "0", name="nodraft")
    yield server
    stop_server(server)



@pytest.fixture(scope="module")
def server(drafting: RunningServer) -> RunningServer:
    """This module's server drafts wherever a lookup has a guess (conftest.py), so what
    drafting keeps is tested whatever this machine's measured step cost says."""
    return drafting


def complete(base_url: str, prompt: str, **extra: object) -> dict:
    r = httpx.post(f"{base_url}/v1/completions", timeout=120, json={
        "model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0,
        **extra})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def draft_counts(base_url: str) -> tuple[int, int]:
    stats = httpx.get(f"{base_url}/health").json()["models"][DEFAULT_MODEL]
    return stats["draft_tokens"], stats["draft_tokens_accepted"]


def forced_text(base_url: str) -> str:
    r = httpx.post(f"{base_url}/detokenize", json={"model": DEFAULT_MODEL, "tokens": [FORCED]})
    return r.json()["content"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 3}])
def test_a_forced_loop_is_drafted_and_every_token_kept(server: RunningServer,
                                                       sampling: dict) -> None:
    piece = forced_text(server.base_url)
    drafted, kept = draft_counts(server.base_url)
    body = complete(server.base_url, "Say it again and again:", max_tokens=30,
                    logit_bias={str(FORCED): 100}, logprobs=1, **sampling)
    choice = body["choices"][0]
    assert choice["text"] == piece * 30
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 30
    assert len(choice["logprobs"]["tokens"]) == 30
    now_drafted, now_kept = draft_counts(server.base_url)
    # The lookup proposes the forced token from the second step on, and it is kept.
    assert now_kept - kept >= 10
    assert now_kept - kept <= now_drafted - drafted


def test_streamed_drafts_arrive_token_by_token(server: RunningServer) -> None:
    piece = forced_text(server.base_url)
    body = {"model": DEFAULT_MODEL, "prompt": "Again:", "max_tokens": 21, "stream": True,
            "logit_bias": {str(FORCED): 100}}
    texts = []
    with httpx.stream("POST", f"{server.v1}/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                texts += [c["text"] for c in json.loads(line[6:])["choices"] if c["text"]]
    assert texts == [piece] * 21


def test_bounds_hold_inside_a_drafted_run(server: RunningServer) -> None:
    piece = forced_text(server.base_url)
    bias = {str(FORCED): 100}
    for max_tokens in (1, 2, 7, 13):
        body = complete(server.base_url, "Once more:", max_tokens=max_tokens, logit_bias=bias)
        assert body["choices"][0]["text"] == piece * max_tokens
        assert body["usage"]["completion_tokens"] == max_tokens
    several = complete(server.base_url, "Once more:", max_tokens=11, n=3, logit_bias=bias,
                       temperature=0.7)
    assert [c["text"] for c in several["choices"]] == [piece * 11] * 3
    assert several["usage"]["completion_tokens"] == 33
    # A stop string met in the middle of a drafted run ends it there: the output is all
    # pieces, so the stop string is its start and nothing before it is returned.
    marked = complete(server.base_url, "Once more:", max_tokens=16, logit_bias=bias,
                      stop=[piece * 6])
    assert marked["choices"][0]["finish_reason"] == "stop"
    assert marked["choices"][0]["text"] == ""
    assert marked["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("prompt", LISTS)
def test_greedy_output_agrees_with_drafting_off(server: RunningServer,
                                                no_draft: RunningServer, prompt: str) -> None:
    reference = complete(no_draft.base_url, prompt, max_tokens=40, logprobs=2,
                         ignore_eos=True)
    drafted = complete(server.base_url, prompt, max_tokens=40, logprobs=2, ignore_eos=True)
    agree_up_to_near_ties(reference, drafted)
    assert drafted["usage"]["completion_tokens"] == 40


def test_the_cache_holds_only_kept_tokens(server: RunningServer,
                                          no_draft: RunningServer) -> None:
    """Rejected drafts leave the sequence's KV: the next turn reuses the first one's
    cache and still agrees with a server that never drafted."""
    first = complete(server.base_url, LISTS[2], max_tokens=24, ignore_eos=True,
                     temperature=0.9, seed=11)
    follow = LISTS[2] + first["choices"][0]["text"] + " and then"
    drafted = complete(server.base_url, follow, max_tokens=12, logprobs=2)
    reference = complete(no_draft.base_url, follow, max_tokens=12, logprobs=2)
    assert drafted["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    agree_up_to_near_ties(reference, drafted)


def test_seeded_sampling_repeats_itself(server: RunningServer) -> None:
    runs = [complete(server.base_url, LISTS[2], max_tokens=32, temperature=0.8, seed=5,
                     ignore_eos=True)["choices"][0]["text"] for _ in range(2)]
    assert runs[0] == runs[1]


def test_drafting_off_never_drafts(no_draft: RunningServer) -> None:
    complete(no_draft.base_url, "Loop:", max_tokens=12, logit_bias={str(FORCED): 100})
    assert draft_counts(no_draft.base_url) == (0, 0)


# --- the pieces that decide, on their own ----------------------------------------------


def test_lookup_continues_a_loop_into_its_own_draft() -> None:
    lookup = LookupDraft([5, 6, 7, 5, 6, 7, 5])
    assert lookup.lookup(5) == [6, 7, 5, 6, 7]
    assert LookupDraft([1, 2, 3]).lookup(4) == []  # no earlier occurrence
    assert LookupDraft([9, -4, -5, 9]).lookup(3) == []  # never an image placeholder


def test_a_reference_is_looked_up_first_and_followed_past_repeats() -> None:
    # The reference repeats "1 2" (a repeated line): after following it to 7, the lookup
    # of "1 2" goes on from there, not back to its first occurrence.
    reference = [1, 2, 3, 7, 1, 2, 4, 8]
    lookup = LookupDraft([1, 2, 9, 1, 2], reference)
    assert lookup.propose(2) == [3, 7]  # the reference wins over the history's [9, 1]
    assert lookup.observe([3, 7, 5]) == 2  # both predicted tokens sampled
    for token in (3, 7, 1, 2):
        lookup.push(token)
    assert lookup.propose(2) == [4, 8]  # past the cursor: the second "1 2"
    assert lookup.observe([6]) == 0
    assert LookupDraft([5, 6], reference).lookup(3) == []  # no n-gram of it occurs
    history_only = LookupDraft([1, 2, 9, 1, 2])
    assert history_only.propose(2) == [9, 1] and history_only.observe([9, 1]) == 0
    # Repeats: the first occurrence at or past the point last followed, else the first.
    repeated = Reference([1, 2, 3, 1, 2, 4])
    assert repeated.follow((1, 2)) == 2
    repeated.cursor = 3
    assert repeated.follow((1, 2)) == 5
    repeated.cursor = 6
    assert repeated.follow((1, 2)) == 2 and repeated.follow((9,)) is None


def test_rates_follow_what_was_sampled() -> None:
    lookup = LookupDraft([1, 2, 1, 2, 1])
    first, run = lookup.rates
    assert lookup.propose(3) == [2, 1, 2]
    lookup.observe([2, 1, 2])  # the first and two further guesses sampled
    assert lookup.first_rate > first and lookup.run_rate > run
    first, run = lookup.rates
    lookup.propose(3)
    lookup.observe([7])  # the first guess missed, after a run of hits: the run ended
    assert lookup.first_rate < first and lookup.run_rate < run
    first, run = lookup.rates
    lookup.propose(3)
    lookup.observe([5])  # missed again, with no run going on: the run rate saw nothing
    assert lookup.first_rate < first and lookup.run_rate == run
    lookup.propose(3)
    lookup.observe([lookup.proposed[0], 9])  # first kept, the second missed
    assert lookup.run_rate < run


def test_a_run_is_seen_without_drafts() -> None:
    """Undrafted steps whose first guesses are sampled one after another feed the run
    rate: where one draft does not pay, drafting could otherwise never start."""
    lookup = LookupDraft([1, 2, 3, 4, 5, 6, 1, 2])
    run = lookup.run_rate
    for token in (3, 4, 5, 6):
        assert lookup.propose(4)[0] == token
        lookup.observe([token])  # one token a step: nothing drafted
        lookup.push(token)
    assert lookup.run_rate > run


def gpu_like(rows: int) -> float:
    return 60 + rows  # a step's fixed cost dwarfs its rows


def test_depth_weighs_kept_drafts_against_rows() -> None:
    loop = [[1, 2, 3, 4]]
    assert choose_depth(loop, [(0.99, 0.99)], range(1, 5), step_cost) == 4
    assert choose_depth(loop, [(0.1, 0.99)], range(1, 5), step_cost) == 0
    eight = loop * 8
    # Eight sequences on a CPU: rows cost nearly what tokens are worth.
    assert choose_depth(eight, [(0.6, 0.6)] * 8, range(1, 5), step_cost) == 0
    assert choose_depth(eight, [(0.6, 0.6)] * 8, range(1, 5), gpu_like) >= 2
    assert choose_depth([[]] * 8, [(0.99, 0.99)] * 8, range(1, 5), gpu_like) == 0


# One sequence of a Qwen2.5-1.5B-shaped Q4_K_M model on 2 AVX-512 cores, as the probe
# times it: llama.cpp's kernel takes rows 16 at a time, so 16 rows cost little more than 8.
_BLOCKED = StepCost((1, 2, 4, 8, 16), (0.036, 0.057, 0.091, 0.208, 0.241),
                    (0.216, 0.256, 0.424, 0.757, 1.435), 8)


def test_depths_are_the_timed_shapes_and_the_cap() -> None:
    assert _BLOCKED.draft_depths(15) == [1, 3, 7, 15]
    assert _BLOCKED.draft_depths(16) == [1, 3, 7, 15, 16]
    assert _BLOCKED.draft_depths(5) == [1, 3, 5]  # --draft-max 5: its own depth too
    assert _BLOCKED.draft_depths(0) == []
    assert _FALLBACK.draft_depths(8) == list(range(1, 9))  # a straight line: any depth


def test_near_verbatim_copying_fills_the_kernels_row_block() -> None:
    """At 98% kept, 15 drafts (16 rows) expect about 13.9 tokens for 241 ms where 8 drafts
    would expect 8.3 for a guessed 9-row time: the timed block wins. A run that is
    often broken does not draft at all; one that looks up only a few tokens drafts only
    as deep as it pays to pad them."""
    def cost(rows: int) -> float:
        return _BLOCKED.seconds(1, rows)

    depths = _BLOCKED.draft_depths(15)
    copying = [list(range(15))]
    assert choose_depth(copying, [(0.98, 0.98)], depths, cost) == 15
    assert choose_depth(copying, [(0.5, 0.5)], depths, cost) == 0
    short = [list(range(3))]
    assert choose_depth(short, [(0.98, 0.98)], depths, cost) == 3


def test_a_copying_run_drafts_deeper_than_its_first_rate_alone_would() -> None:
    """A block copied from the prompt: the first guess after a miss is uncertain, the
    rest of the run is not. One rate for all positions would stop short."""
    long = [list(range(8))]
    assert choose_depth(long, [(0.7, 0.7)], range(1, 9), step_cost) <= 2
    assert choose_depth(long, [(0.7, 0.98)], range(1, 9), step_cost) == 8


def test_the_margin_grows_beyond_eight_sequences() -> None:
    # A gain that pays for one sequence pays for eight too; beyond eight the host's work
    # on every drafted row, which the step cost leaves out, weighs more.
    per_row = [[1]]

    def each(n: int):  # n sequences, each step costing what one sequence's would
        return lambda rows: n * step_cost(rows // n)

    assert choose_depth(per_row, [(0.45, 0.0)], range(1, 2), step_cost) == 1
    assert choose_depth(per_row * 8, [(0.45, 0.0)] * 8, range(1, 2), each(8)) == 1
    assert choose_depth(per_row * 16, [(0.45, 0.0)] * 16, range(1, 2), each(16)) == 0
    # Below the margin (a 10% gain expected) nothing is drafted, even for one sequence.
    assert choose_depth(per_row, [(0.40, 0.0)], range(1, 2), step_cost) == 0
