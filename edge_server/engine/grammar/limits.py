"""Bounds on what a JSON schema may turn into, and the last check of the GBNF text.

llama.cpp's grammar code is written for trusted grammars: its parser recurses once per
nested group (about 450 bytes of stack each, so roughly 18,000 levels overflow an
8 MiB thread stack and kill the process), its left-recursion check recurses once per
chained rule (about 130 bytes each), and a repetition `{n,m}` with m < n makes it
create rules until memory runs out. Repetitions are also expanded into one rule per
optional copy. So every count a schema can ask for is bounded here, in Python, before
llama.cpp sees the grammar; the bounds below leave that parser under 1 MiB of stack.

Limits (per schema):

- strings: `minLength`/`maxLength` up to MAX_STRING_LENGTH characters;
- arrays: `minItems`/`maxItems` up to MAX_ARRAY_ITEMS, tuples (`prefixItems`) up to
  MAX_TUPLE_ITEMS entries;
- `pattern`: a quantifier's counts, multiplied through nested quantifiers, up to
  MAX_PATTERN_REPEAT (nested counted repetitions multiply the parser's live states), no
  counted quantifier over a part that can be empty, at most MAX_PATTERN_LENGTH
  characters and MAX_PATTERN_NESTING nested groups;
- numbers: `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum` within
  ±MAX_NUMERIC_BOUND (integers are generated with at most 16 digits);
- structure: MAX_SCHEMA_DEPTH nested subschemas, MAX_SCHEMA_NODES subschemas in all,
  MAX_PROPERTIES properties per object, MAX_ENUM_VALUES enum values, MAX_ALTERNATIVES
  branches per anyOf/oneOf/allOf, MAX_DOCUMENT_DEPTH levels of JSON nesting anywhere;
- the finished grammar: MAX_GRAMMAR_CHARS characters, MAX_GRAMMAR_RULES rules once
  llama.cpp has expanded its repetitions, groups nested at most MAX_GROUP_NESTING deep,
  and every `{n,m}` with n <= m <= MAX_GBNF_REPEAT.

Past a limit, a strict schema (`json_schema.strict: true`) is refused with a 400 that
names the keyword, where it is (a JSON pointer such as `#/properties/name`) and the
limit. Otherwise the request is served with a relaxed schema:

- a too large upper bound (`maxLength`, `maxItems`) is lowered to the limit, so the
  output still satisfies the schema;
- a too large lower bound (`minLength`, `minItems`) is dropped, since no output of a
  reasonable length could meet it;
- a numeric bound beyond ±MAX_NUMERIC_BOUND is clamped to it;
- a `pattern` over the limits, or one the grammar cannot enforce (unanchored, look-
  arounds, unsupported escapes), is ignored: the string is only held to its lengths.

Limits on structure (depth, counts of properties, enum values or branches, grammar size)
have no relaxation and are refused either way, as are malformed schemas.
"""

from __future__ import annotations

import re

MAX_STRING_LENGTH = 16_384
MAX_ARRAY_ITEMS = 4_096
MAX_TUPLE_ITEMS = 256
MAX_PATTERN_REPEAT = 1_000
MAX_PATTERN_LENGTH = 2_048
MAX_PATTERN_NESTING = 100  # groups in groups
MAX_NUMERIC_BOUND = 10**15 - 1
MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_NODES = 4_096
MAX_PROPERTIES = 256
MAX_ENUM_VALUES = 1_024
MAX_ALTERNATIVES = 256
MAX_DOCUMENT_DEPTH = 64

MAX_GBNF_REPEAT = 1_000  # llama.cpp silently turns a bound above 2,000 into "unbounded"
MAX_GRAMMAR_CHARS = 512 * 1024
MAX_GRAMMAR_RULES = 32_768
MAX_GROUP_NESTING = 2_000
# llama.cpp refuses a repetition whose item spawned this many rules times the count.
LLAMA_REPETITION_THRESHOLD = 2_000


class SchemaError(ValueError):
    """The schema is not one this server can turn into a grammar (a 400)."""


_TOKEN = re.compile(
    r"""
      (?P<literal>"(?:[^"\\]|\\.)*")
    | (?P<cls>\[(?:[^\]\\]|\\.)*\])
    | (?P<define>::=)
    | (?P<token>!?<(?:\[[0-9]{1,10}\]|[^<>\s\[]{1,256})>)
    | (?P<any>\.)
    | (?P<name>[A-Za-z0-9_-]+)
    | (?P<open>\()
    | (?P<close>\))
    | (?P<counted>\{\s*(?P<lo>\d+)\s*(?P<comma>,\s*(?P<hi>\d*)\s*)?\})
    | (?P<op>[*+?])
    | (?P<alt>\|)
    | (?P<space>[ \t\r\n]+)
    | (?P<comment>\#[^\n]*)
    """,
    re.VERBOSE | re.DOTALL,
)


def check_grammar(gbnf: str) -> None:
    """Refuses GBNF text whose parse or expansion in llama.cpp could exhaust the stack,
    memory or time. Mirrors llama.cpp's parser: each group and each repetition's
    optional copy becomes a rule of its own."""
    if len(gbnf) > MAX_GRAMMAR_CHARS:
        raise SchemaError(
            f"the grammar for this schema has {len(gbnf)} characters, over the limit of "
            f"{MAX_GRAMMAR_CHARS}"
        )
    rules = 0
    # One entry per open group: rules generated inside it so far.
    groups: list[int] = [0]
    last_spawned = 1  # rules spawned by the last symbol (a group: its own and inner ones)
    pos = 0
    while pos < len(gbnf):
        m = _TOKEN.match(gbnf, pos)
        if m is None:
            raise SchemaError(f"the grammar has an unexpected character at offset {pos}")
        pos = m.end()
        kind = m.lastgroup
        if kind == "define":
            if len(groups) != 1:
                raise SchemaError("the grammar has an unclosed group")
            rules += 1 + groups[0]
            groups = [0]
        elif kind == "open":
            groups.append(0)
            if len(groups) > MAX_GROUP_NESTING:
                raise SchemaError(
                    f"the grammar nests groups more than {MAX_GROUP_NESTING} deep"
                )
        elif kind == "close":
            if len(groups) == 1:
                raise SchemaError("the grammar closes a group it never opened")
            inner = groups.pop()
            last_spawned = inner + 1
            groups[-1] += last_spawned
        elif kind == "token":
            # llama.cpp aborts the process (an exception through its C API) when a
            # sampled token's text runs from characters into a token element, as in
            # `"a" !<[7]>` and the piece "ab": token references are not accepted.
            raise SchemaError(f"the grammar refers to a token ({m.group()}) at offset "
                              f"{m.start()}; token references are not supported")
        elif kind in ("literal", "cls", "name", "any"):
            last_spawned = 1
        elif kind == "op":
            _check_spawn(last_spawned, 1)
            groups[-1] += 1
        elif kind == "counted":
            lo = int(m.group("lo"))
            hi_text = m.group("hi")
            hi = lo if m.group("comma") is None else (int(hi_text) if hi_text else None)
            if lo > MAX_GBNF_REPEAT or (hi is not None and not lo <= hi <= MAX_GBNF_REPEAT):
                raise SchemaError(
                    f"the grammar repeats {m.group('counted')}, outside 0 <= n <= m <= "
                    f"{MAX_GBNF_REPEAT}"
                )
            total = hi if hi else max(lo, 1)
            _check_spawn(last_spawned, total)
            spawned = 1 if hi is None else hi - lo
            groups[-1] += spawned
            last_spawned *= total
        if rules + sum(groups) > MAX_GRAMMAR_RULES:
            raise SchemaError(
                f"the grammar for this schema expands to more than {MAX_GRAMMAR_RULES} rules"
            )
    if len(groups) != 1:
        raise SchemaError("the grammar has an unclosed group")


def _check_spawn(spawned: int, times: int) -> None:
    if spawned * times > LLAMA_REPETITION_THRESHOLD:
        raise SchemaError(
            f"the grammar repeats a group of {spawned} rules {times} times, over "
            f"llama.cpp's limit of {LLAMA_REPETITION_THRESHOLD}"
        )
