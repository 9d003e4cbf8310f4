"""Characters of a `pattern`, rewritten for the schema converter so that the grammar
writes them as JSON string text.

The converter copies regex escapes and character classes into GBNF as they are, but
llama.cpp's GBNF knows only a few escapes (`\\d`, `\\.` or `\\w` make it refuse the
grammar), and what the pattern matches is the string's value while the grammar writes
its JSON text: a quote, a backslash or a control character must come out escaped. So
escapes become plain characters or classes, a literal quote becomes `\\"`, and `.` and
classes leave out what JSON cannot hold raw (a class is narrowed to the rest).
"""

from __future__ import annotations


class PatternProblem(ValueError):
    """Why a pattern cannot be enforced (completes "the pattern …"). `over_limit`: it is
    past a size limit, which is refused even when the schema is not strict."""

    def __init__(self, message: str, *, over_limit: bool = False) -> None:
        super().__init__(message)
        self.over_limit = over_limit


Ranges = list[tuple[int, int]]

_SHORT_ESCAPES = {"\n": "n", "\t": "t", "\r": "r", "\b": "b", "\f": "f"}
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
# Read specially by the converter outside a class; written as a class instead.
_CONVERTER_SPECIAL = set("|.()[]{}*+?\\\"")
_CLASS_ESCAPES: dict[str, Ranges] = {
    "d": [(0x30, 0x39)],
    "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "s": [(0x20, 0x20)],  # other whitespace would need escapes in JSON text
}
# What a JSON string cannot hold unescaped.
_UNSAFE: Ranges = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]


def _code(cp: int) -> str:
    """A code point inside a GBNF character class."""
    c = chr(cp)
    if c.isascii() and c.isalnum():
        return c
    if cp <= 0xFF:
        return f"\\x{cp:02X}"
    if cp <= 0xFFFF:
        return f"\\u{cp:04X}"
    return f"\\U{cp:08X}"


def _merge(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _subtract(ranges: Ranges, remove: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in _merge(ranges):
        for r_lo, r_hi in _merge(remove):
            if r_hi < lo or r_lo > hi:
                continue
            if r_lo > lo:
                out.append((lo, r_lo - 1))
            lo = r_hi + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return out


def class_text(ranges: Ranges, negated: bool) -> str:
    """A GBNF class for JSON string text: a negated class also excludes what JSON must
    escape, a plain one is narrowed to what it may hold raw."""
    if negated:
        kept = _merge(ranges + _UNSAFE)
    elif not ranges:
        raise PatternProblem("has an empty character class")
    else:
        kept = _subtract(ranges, _UNSAFE)
        if not kept:
            raise PatternProblem("has a character class of only characters JSON must escape")
    body = "".join(_code(lo) if lo == hi else f"{_code(lo)}-{_code(hi)}" for lo, hi in kept)
    return f"[{'^' if negated else ''}{body}]"


def any_char() -> str:
    """`.`: any character a JSON string holds raw (the converter's would allow quotes)."""
    return class_text([], negated=True)


def literal(c: str) -> str:
    """Regex text, as the converter reads it, that writes the JSON text of character c."""
    if c in _SHORT_ESCAPES:
        return f"(\\\\{_SHORT_ESCAPES[c]})"
    if c == '"':
        return '(\\\\")'
    if c == "\\":
        return "(\\\\\\\\)"
    if ord(c) < 0x20:
        return f"(\\\\u{ord(c):04x})"
    if c in _CONVERTER_SPECIAL:
        return f"[{_code(ord(c))}]"
    return c


def escape(body: str, i: int) -> tuple[str, int]:
    """The escape at body[i] ("\\"): (regex text for the converter, index after it)."""
    if i + 1 >= len(body):
        raise PatternProblem("ends with a lone backslash")
    e = body[i + 1]
    if e in _CLASS_ESCAPES:
        return class_text(_CLASS_ESCAPES[e], negated=False), i + 2
    if e.lower() in _CLASS_ESCAPES:
        return class_text(_CLASS_ESCAPES[e.lower()], negated=True), i + 2
    cp, end = _escaped_code(body, i)
    return literal(chr(cp)), end


def _escaped_code(body: str, i: int) -> tuple[int, int]:
    """The single character an escape at body[i] stands for, and the index after it."""
    e = body[i + 1]
    if e in _CONTROL_ESCAPES:
        return ord(_CONTROL_ESCAPES[e]), i + 2
    if e in "xu":
        digits = body[i + 2 : i + (4 if e == "x" else 6)]
        width = 2 if e == "x" else 4
        if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise PatternProblem(f"has an invalid escape \\{e}{digits}")
        return int(digits, 16), i + 2 + width
    if e.isascii() and not e.isalnum():
        return ord(e), i + 2
    raise PatternProblem(f"uses the escape \\{e}, which cannot be enforced")


def char_class(body: str, i: int) -> tuple[str, int]:
    """The class starting at body[i] ("["): (GBNF class, index after it). It ends at the
    first unescaped "]", as the converter reads it."""
    j = i + 1
    negated = j < len(body) and body[j] == "^"
    j += negated
    ranges: Ranges = []
    while j < len(body) and body[j] != "]":
        if body[j] == "\\" and j + 1 < len(body) and body[j + 1].lower() in _CLASS_ESCAPES:
            if body[j + 1] not in _CLASS_ESCAPES:
                raise PatternProblem(f"uses \\{body[j + 1]} inside a class")
            ranges += _CLASS_ESCAPES[body[j + 1]]
            j += 2
            continue
        lo, j = _class_char(body, j)
        hi = lo
        if j + 1 < len(body) and body[j] == "-" and body[j + 1] != "]":
            hi, j = _class_char(body, j + 1)
            if hi < lo:
                raise PatternProblem(f"has a reversed range in a class at offset {j}")
        ranges.append((lo, hi))
    if j >= len(body):
        raise PatternProblem("has an unclosed [")
    return class_text(ranges, negated), j + 1


def _class_char(body: str, j: int) -> tuple[int, int]:
    if body[j] != "\\":
        return ord(body[j]), j + 1
    if j + 1 >= len(body):
        raise PatternProblem("has an unclosed [")
    if body[j + 1] == "b":
        return 0x08, j + 2
    return _escaped_code(body, j)
