"""Writes the HAProxy configuration of systemd/haproxy/edge-server.cfg with other
addresses: where HAProxy listens, its stats page, and one `server` line per replica.

    python scripts/deploy/haproxy_config.py --listen 127.0.0.1:8080 \\
        --replica 127.0.0.1:8081 --replica 127.0.0.1:8082 > haproxy.cfg

--foreground: for a HAProxy run by hand (haproxy -db -f FILE): log to stderr and keep
the invoking user instead of switching to the `haproxy` user.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parents[2] / "systemd" / "haproxy" / "edge-server.cfg"


def render(template: str, listen: str, replicas: list[str], stats: str | None = None,
           foreground: bool = False) -> str:
    out: list[str] = []
    section = ""
    servers_written = False
    for line in template.splitlines():
        word = line.split()[0] if line.strip() else ""
        indent = line[: len(line) - len(line.lstrip())]
        if not indent and word:
            section = line.strip()
        if section == "global" and foreground and word in ("user", "group"):
            continue
        if section == "global" and foreground and word == "log":
            line = f"{indent}log stderr format short local0 notice"
        elif section == "frontend edge" and word == "bind":
            line = f"{indent}bind {listen}"
        elif section == "listen stats" and word == "bind":
            if stats is None:
                continue
            line = f"{indent}bind {stats}"
        elif section == "backend replicas" and word == "server":
            if servers_written:
                continue
            servers_written = True
            out += [f"{indent}server replica{i} {addr}" for i, addr in enumerate(replicas, 1)]
            continue
        out.append(line)
    if stats is None:  # a stats section with no bind is an error: drop the section
        out = _without_section(out, "listen stats")
    return "\n".join(out) + "\n"


def _without_section(lines: list[str], name: str) -> list[str]:
    kept: list[str] = []
    skipping = False
    for line in lines:
        if line and not line[0].isspace():
            skipping = line.strip() == name
        if not skipping:
            kept.append(line)
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT clients use")
    parser.add_argument("--replica", action="append", required=True, help="HOST:PORT of "
                        "one edge_server (repeat for each)")
    parser.add_argument("--stats", default=None, help="HOST:PORT of the stats page (none "
                        "by default)")
    parser.add_argument("--foreground", action="store_true", help="log to stderr, keep "
                        "the invoking user")
    parser.add_argument("--template", type=Path, default=TEMPLATE)
    args = parser.parse_args()
    sys.stdout.write(render(args.template.read_text(encoding="utf-8"), args.listen,
                            args.replica, args.stats, args.foreground))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
