"""Which `pattern`s the schema converter may turn into a grammar, read the way it reads
them, and the pattern rewritten for it (pattern_chars: escapes and JSON string text).

The converter expands `x{n,m}` into n copies and m-n nested optional groups, and a
counted repetition inside another one multiplies the positions llama.cpp tracks at
once (measured: `(a{1,31}){1,31}` already costs 0.3 s per token where the grammar
filters the whole vocabulary, and `(a?){0,1000}` had not finished one token in 100 s).
So quantifiers are bounded by their product along the nesting, and a counted quantifier
over something that can match nothing is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_server.engine.grammar.limits import (
    MAX_PATTERN_LENGTH,
    MAX_PATTERN_NESTING,
    MAX_PATTERN_REPEAT,
)
from edge_server.engine.grammar.pattern_chars import (
    PatternProblem,
    any_char,
    char_class,
    escape,
    literal,
)

__all__ = ["PatternProblem", "check_pattern"]


@dataclass
class _Atom:
    nullable: bool  # can match the empty string
    product: int = 1  # largest product of counted quantifiers inside


@dataclass
class _Group:
    any_alt_nullable: bool = False
    alt_nullable: bool = True  # the alternative being read, so far
    product: int = 1
    last: _Atom | None = None  # the item a following quantifier applies to

    def commit(self) -> None:
        if self.last is not None:
            self.alt_nullable = self.alt_nullable and self.last.nullable
            self.product = max(self.product, self.last.product)
            self.last = None


def check_pattern(pattern: str) -> str:
    """The pattern as the converter should get it; raises PatternProblem unless it turns
    into a grammar of bounded size and ambiguity."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise PatternProblem(
            f"is {len(pattern)} characters long, over the limit of {MAX_PATTERN_LENGTH}",
            over_limit=True,
        )
    if not (pattern.startswith("^") and pattern.endswith("$")) or len(pattern) < 2:
        raise PatternProblem("must be anchored with ^ and $ to be enforced")
    body = pattern[1:-1]
    out: list[str] = []
    stack = [_Group()]
    i = 0
    while i < len(body):
        c = body[i]
        group = stack[-1]
        text = c
        if c == "(":
            if body.startswith("(?", i):
                raise PatternProblem("uses a (?...) group, which cannot be enforced")
            group.commit()
            stack.append(_Group())
            if len(stack) > MAX_PATTERN_NESTING:
                raise PatternProblem(f"nests groups over the limit of {MAX_PATTERN_NESTING}",
                                     over_limit=True)
            i += 1
        elif c == ")":
            if len(stack) == 1:
                raise PatternProblem("closes a group it never opened")
            inner = stack.pop()
            inner.commit()
            nullable = inner.any_alt_nullable or inner.alt_nullable
            stack[-1].commit()
            stack[-1].last = _Atom(nullable, inner.product)
            i += 1
        elif c == "|":
            group.commit()
            group.any_alt_nullable = group.any_alt_nullable or group.alt_nullable
            group.alt_nullable = True
            i += 1
        elif c in "*+?":
            atom = _quantified(group, c)
            if c != "?" and atom.nullable:
                raise PatternProblem(f"repeats with {c} a part that can be empty")
            atom.nullable = atom.nullable or c != "+"
            i += 1
        elif c == "{":
            end = body.find("}", i)
            if end < 0:
                raise PatternProblem("has an unclosed {")
            text = body[i : end + 1]
            _counted(group, text)
            i = end + 1
        else:
            if c == "[":
                text, i = char_class(body, i)
            elif c == "\\":
                text, i = escape(body, i)
            else:
                text, i = (any_char() if c == "." else literal(c)), i + 1
            group.commit()
            group.last = _Atom(False)
        out.append(text)
    if len(stack) != 1:
        raise PatternProblem("has an unclosed group")
    return "^" + "".join(out) + "$"


def _quantified(group: _Group, quantifier: str) -> _Atom:
    if group.last is None:
        raise PatternProblem(f"has nothing before {quantifier} to repeat")
    return group.last


def _counted(group: _Group, text: str) -> None:
    atom = _quantified(group, text)
    parts = [p.strip() for p in text[1:-1].split(",")]
    # As the converter reads it: {n}, {n,}, {n,m}, and {,m} with a lower bound of 0.
    malformed = any(p and not (p.isascii() and p.isdigit()) for p in parts)
    if len(parts) > 2 or malformed or parts == [""]:
        raise PatternProblem(f"has an invalid quantifier {text}")
    if any(len(p) > 9 for p in parts):
        raise PatternProblem(f"repeats {text}, over the limit of {MAX_PATTERN_REPEAT}",
                             over_limit=True)
    lo = int(parts[0]) if parts[0] else 0
    hi: int | None = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
    if hi is not None and hi < lo:
        raise PatternProblem(f"has a quantifier {text} whose maximum is below its minimum")
    if atom.nullable:
        raise PatternProblem(f"repeats with {text} a part that can be empty")
    product = max(lo, hi or 0, 1) * atom.product
    if product > MAX_PATTERN_REPEAT:
        nested = f" ({product} with the repetitions inside it)" if atom.product > 1 else ""
        raise PatternProblem(f"repeats {text}{nested}, over the limit of {MAX_PATTERN_REPEAT}",
                             over_limit=True)
    atom.product = product
    atom.nullable = lo == 0


