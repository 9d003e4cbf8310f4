"""Disconnect soak: clients that give up at every stage of a request must leave the server
with nothing running, nothing queued and no lease held; the model must then unload after
its keep_alive, and SIGTERM must stop the idle server at once.

    .venv/bin/python scripts/soak/soak_disconnects.py                    # starts its own server
    .venv/bin/python scripts/soak/soak_disconnects.py --plain 50 --streams 50 --base-url URL

Sends --plain non-stream requests whose client times out while they still run, and
--streams streaming requests dropped while queued, while their long prompt is evaluated,
or after some tokens; then checks /health, the unload and (for its own server) SIGTERM.
Traffic goes to 127.0.0.1 only. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys

from edge_testkit.servers.process import loopback_url
from edge_testkit.soak.disconnects import soak, start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", type=int, default=200)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--keep-alive", type=float, default=3.0,
                        help="of the server started here; with --base-url, the server's own")
    parser.add_argument("--threads", type=int, default=1, help="of the server started here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-url", help="a running server on 127.0.0.1 (default: start one)")
    args = parser.parse_args()
    server = None
    if args.base_url:
        base_url = loopback_url(args.base_url)
    else:
        server = start(args.keep_alive, args.threads)
        base_url = server.base_url
        print(f"server on {base_url}, log {server.log_path}", flush=True)
    try:
        report = soak(base_url, server, plain=args.plain, streams=args.streams,
                      concurrency=args.concurrency, keep_alive=args.keep_alive, seed=args.seed)
    finally:
        if server is not None and server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    print(f"requests: {args.plain} plain + {args.streams} streams, "
          f"concurrency {args.concurrency}; outcomes:")
    report.print()
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
