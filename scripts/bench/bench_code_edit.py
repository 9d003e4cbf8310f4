"""The code-edit workload: a ~300-token block of code, asked back with one change, at
temperature 0. The answer largely repeats the prompt, which is where lookup drafting
should gain most (compare with `--peer-edge "--draft-max 0"`). Each answer is the same
number of tokens (`ignore_eos`, no stop), so the rates compare like with like even where
the two servers' greedy texts part (see docs/performance.md on drafting's numerics)."""

from __future__ import annotations

import argparse
import random
import statistics

import httpx
from bench_compare import Series, alternate, burst, fresh_tag

from edge_testkit.bench.servers import ServerProcess

CODE = '''def summarize_orders(orders, tax_rate=0.2, currency="EUR"):
    """Totals per customer, with tax, for orders given as dicts."""
    totals = {}
    for order in orders:
        customer = order["customer"]
        amount = order["quantity"] * order["unit_price"]
        if order.get("discount"):
            amount = amount * (1 - order["discount"])
        totals[customer] = totals.get(customer, 0) + amount
    report = []
    for customer, subtotal in sorted(totals.items()):
        tax = round(subtotal * tax_rate, 2)
        report.append({
            "customer": customer,
            "subtotal": round(subtotal, 2),
            "tax": tax,
            "total": round(subtotal + tax, 2),
            "currency": currency,
        })
    return report


def largest_customers(report, count=3):
    """The customers with the largest totals, largest first."""
    ranked = sorted(report, key=lambda row: row["total"], reverse=True)
    return [row["customer"] for row in ranked[:count]]


def print_report(report):
    for row in report:
        line = f"{row['customer']:<20} {row['subtotal']:>10.2f} {row['tax']:>8.2f}"
        print(line + f" {row['total']:>10.2f} {row['currency']}")
'''

CHANGES = [("tax_rate", "vat_rate"), ("subtotal", "net"), ("report", "rows"),
           ("customer", "client"), ("currency", "unit")]


def edit_prompt(tag: str, old: str, new: str) -> str:
    """A completion prompt whose answer is CODE again with `old` renamed to `new`."""
    return (f"# file {tag}\n```python\n{CODE}```\n\nThe same code with `{old}` renamed to "
            f"`{new}` everywhere, otherwise unchanged:\n```python\n")


def mode_code_edit(args: argparse.Namespace, servers: list[ServerProcess]) -> None:
    speed, produced = Series(), Series()
    sampling = {"temperature": 0}

    def measure(server: ServerProcess, r: int) -> None:
        # Round r asks both servers for the same change (how many tokens a change touches,
        # and so how many drafts miss, differs from one change to the next).
        old, new = random.Random(5 + r).choice(CHANGES)
        prompt = edit_prompt(fresh_tag(), old, new)  # unseen: no cached prefix helps
        wall, results = burst(server.url, [prompt], args.edit_tokens, sampling)
        # Decode speed: tokens after the first, over the time after the first.
        result = results[0]
        speed.add(server.name, max(result.tokens - 1, 0) / max(wall - result.ttft, 1e-9))
        produced.add(server.name, result.tokens)

    alternate(args.rounds, servers, measure)
    print(speed.line("code edit, 1 client, decode tokens/s", "tok/s"))
    for name, counts in produced.rounds.items():
        print(f"  {name}: tokens per answer {statistics.median(counts):.0f} "
              f"(rounds: {', '.join(str(int(c)) for c in counts)})")
    for server in servers:
        if server.name.startswith("edge_server"):
            stats = httpx.get(f"{server.url}/health").json()["models"]["bench"]
            print(f"  {server.name} lookup drafts: {stats['draft_tokens_accepted']} kept of "
                  f"{stats['draft_tokens']} drafted")
