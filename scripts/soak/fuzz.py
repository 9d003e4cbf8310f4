"""A fuzzing campaign against the real server: the generators of tests/fuzz/test_fuzz.py, run
for many more requests, with figures at the end.

    .venv/bin/python scripts/soak/fuzz.py --requests 10000              # starts its own server
    .venv/bin/python scripts/soak/fuzz.py --base-url http://127.0.0.1:8080 --time-limit 600
    .venv/bin/python scripts/soak/fuzz.py --edge-share 1 --requests 11000   # every edge case

A share of the requests (--route-share) go to the routes beside generation: rerank,
stored Responses (previous_response_id, chains of them carrying up to 7.5 MB of unknown
fields per turn; GET, DELETE and input_items of stored and junk ids), Ollama's
/api/create (junk Modelfiles, and Modelfiles about as long as they may be: thousands of
comment, odd, FROM or PARAMETER lines) and /api/blobs (junk, and uploads of a few MiB),
GET /slots and /tokenize with_pieces.

A share of the requests (--edge-share) are edge cases (edge_testkit/fuzz/edges.py): every
numeric field of every door at the bounds of C types and of the model served, taken in
a shuffled order that goes through all of them before repeating one.

Traffic goes to 127.0.0.1 only. Exits 1 when any answer was a failure (see `judge` in
edge_testkit/fuzz/judge.py) or the server is not serving at the end; failing bodies are
printed (truncated) and, with --save-dir, written whole for replay with
`curl --data-binary @FILE -H 'Content-Type: application/json' URL`.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
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
from edge_testkit.servers.process import RunningServer, loopback_url, start_server, stop_server

_DONE = object()


class Campaign:
    def __init__(self, base_url: str, args: argparse.Namespace,
                 server: RunningServer | None) -> None:
        self.base_url = base_url
        self.args = args
        self.server = server
        self.work: queue.Queue[object] = queue.Queue(maxsize=args.concurrency * 2)
        self.lock = threading.Lock()
        self.sent: collections.Counter[str] = collections.Counter()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.kinds: collections.Counter[str] = collections.Counter()
        self.failures: list[fj.Result] = []
        self.slowest: list[tuple[float, str, str]] = []  # (seconds, path, kind)
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.edges = self._edge_cases()
        self.edge_credit = 0.0
        self.route_credit = 0.0

    def _edge_cases(self) -> itertools.cycle[fs.Case] | None:
        if self.args.edge_share <= 0:
            return None
        limits = fe.read_limits(self.base_url)
        cases = [case for case in fe.edge_cases(fe.read_spec(self.base_url), limits)
                 if case.kind.removeprefix("edge ") not in self.args.edge_skip]
        print(f"edge cases: {len(cases)} (n_ctx {limits.n_ctx}, n_vocab {limits.n_vocab})",
              flush=True)
        return itertools.cycle(fe.shuffled(cases, self.args.seed))

    def with_edges(self, drawn: fs.Case) -> fs.Case:
        """The drawn case, or in its place the next edge case (--edge-share of them)."""
        self.edge_credit += self.args.edge_share
        if self.edges is None or self.edge_credit < 1:
            return drawn
        self.edge_credit -= 1
        return next(self.edges)

    def with_routes(self, drawn: fs.Case, beside: fs.Case) -> fs.Case:
        """The drawn case, or in its place one to a route beside generation
        (--route-share of them)."""
        self.route_credit += self.args.route_share
        if self.route_credit < 1:
            return drawn
        self.route_credit -= 1
        return beside

    def generate(self) -> None:
        """Feeds generated cases to the workers until the count or the time is used up."""
        budget = {"left": self.args.requests}

        @settings(max_examples=self.args.requests, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @seed(self.args.seed)
        @given(st.one_of(fc.all_cases(), fo.ollama_cases(), fb.bound_cases(),
                         fn.nested_tool_cases()),
               st.one_of(fx.extra_cases(), fst.stored_cases(), fo.model_file_cases()))
        def produce(case: fs.Case, beside: fs.Case) -> None:
            if budget["left"] <= 0 or self.stop.is_set():
                return
            if time.monotonic() - self.started > self.args.time_limit:
                self.stop.set()
                return
            budget["left"] -= 1
            self.work.put(self.with_edges(self.with_routes(case, beside)))

        try:
            produce()
        finally:
            for _ in range(self.args.concurrency):
                self.work.put(_DONE)

    def send_all(self) -> None:
        with fj.new_client(self.base_url) as client:
            while (case := self.work.get()) is not _DONE:
                assert isinstance(case, fs.Case)
                if self.stop.is_set() and self.server_dead():
                    continue
                self.record(fj.exchange(client, case))

    def record(self, result: fj.Result) -> None:
        with self.lock:
            self.sent[result.case.label] += 1
            self.kinds[result.case.kind.split()[0]] += 1  # "edge <field>": "edge"
            label = str(result.status) if result.status is not None else result.failure
            self.statuses[str(label)] += 1
            self.slowest = sorted([*self.slowest, (result.seconds, result.case.label,
                                                   result.case.kind)], reverse=True)[:5]
            if result.failure is not None:
                self.failures.append(result)
                print(f"FAIL {result.failure}: {result.case.method} {result.case.path} "
                      f"{result.case.excerpt(300)}",
                      flush=True)
            total = sum(self.sent.values())
            if total % 500 == 0:
                print(f"... {total} requests, {len(self.failures)} failures, "
                      f"{time.monotonic() - self.started:.0f}s", flush=True)
        if result.failure == "dropped connection" and self.server_dead():
            print("the server process is gone: stopping", flush=True)
            self.stop.set()

    def server_dead(self) -> bool:
        return self.server is not None and self.server.process.poll() is not None

    def run(self) -> None:
        workers = [threading.Thread(target=self.send_all) for _ in range(self.args.concurrency)]
        for worker in workers:
            worker.start()
        self.generate()
        for worker in workers:
            worker.join()

    def report(self) -> int:
        problem = fj.server_problem(self.base_url)
        by_reason = collections.Counter(r.failure for r in self.failures)
        fivexx = sum(n for s, n in self.statuses.items() if s.isdigit() and int(s) >= 500)
        print(f"\nrequests: {sum(self.sent.values())} in {time.monotonic() - self.started:.0f}s"
              f" ({', '.join(f'{p}: {n}' for p, n in sorted(self.sent.items()))})")
        print(f"generators: {dict(sorted(self.kinds.items()))}")
        print(f"statuses: {dict(sorted(self.statuses.items()))}")
        print(f"5xx answers: {fivexx}   timeouts: {by_reason['timeout']}   "
              f"dropped connections: {by_reason['dropped connection']}   "
              f"slowest answer: {self.slowest[0][0] if self.slowest else 0:.1f}s")
        print("slowest: " + ", ".join(f"{s:.1f}s {path} ({kind})"
                                      for s, path, kind in self.slowest))
        print(f"failures: {len(self.failures)} {dict(by_reason)}")
        edge_fields = collections.Counter(f"{r.case.path} {r.case.kind[5:]}"
                                          for r in self.failures if r.case.kind.startswith("edge "))
        if edge_fields:
            print(f"failing edge fields: {dict(edge_fields)}")
        print(f"server alive at the end: {'yes' if problem is None else 'NO: ' + problem}")
        if self.server is not None:
            print(f"tracebacks in the server log: {self.server.log_text().count('Traceback')}"
                  f" ({self.server.log_path})")
        for i, result in enumerate(self.failures[: self.args.show]):
            print(f"\n[{i}] {result.failure} after {result.seconds:.1f}s: "
                  f"{result.case.method} {result.case.path}"
                  f"\n    body: {result.case.excerpt()}\n    answer: {result.detail[:300]!r}")
        if self.args.save_dir is not None:
            self.args.save_dir.mkdir(parents=True, exist_ok=True)
            for i, result in enumerate(self.failures):
                name = result.case.path.strip("/").replace("/", "_")
                (self.args.save_dir / f"{i:04d}-{name}.json").write_bytes(result.case.body)
            print(f"\nfailing bodies written to {self.args.save_dir}")
        return 0 if not self.failures and problem is None else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--time-limit", type=float, default=1800, help="seconds")
    parser.add_argument("--base-url", help="a running server on 127.0.0.1 (default: start one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--ctx-size", type=int, default=256, help="of the server started here")
    parser.add_argument("--threads", type=int, default=1, help="of the server started here")
    parser.add_argument("--memory-limit-mb", type=int, default=3072,
                        help="address-space cap of the server started here")
    parser.add_argument("--route-share", type=float, default=0.12,
                        help="share of the requests to the routes beside generation (0 to 1)")
    parser.add_argument("--edge-share", type=float, default=0.25,
                        help="share of the requests that are edge cases (0 to 1)")
    parser.add_argument("--edge-skip", type=lambda v: set(v.split(",")), default=set(),
                        help="numeric fields left out of the edge cases, comma-separated "
                             "as the report names them (options.repeat_last_n,n_probs)")
    parser.add_argument("--show", type=int, default=30, help="failing bodies printed")
    parser.add_argument("--save-dir", type=Path, help="write every failing body here")
    args = parser.parse_args()

    server = None
    if args.base_url:
        base_url = loopback_url(args.base_url)
    else:
        extra = ["--threads", str(args.threads)]
        server = start_server(Path(tempfile.mkdtemp(prefix="fuzz-")), "--ctx-size",
                              str(args.ctx_size), "--parallel", "4", "--slots", *extra, name="fuzz",
                              memory_limit_mb=args.memory_limit_mb)
        base_url = server.base_url
        print(f"server on {base_url}, log {server.log_path}", flush=True)
    campaign = Campaign(base_url, args, server)
    try:
        campaign.run()
        return campaign.report()
    finally:
        if server is not None:
            stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
