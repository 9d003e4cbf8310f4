"""Chat template renders are bounded: a template that would write gigabytes (loops over
caller text, string products, huge powers, padding or replacing strings) stops after a
bounded amount of output."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from edge_server.engine.chat_template import ChatTemplate, TemplateTooLong

LIMIT = 1_000_000
MESSAGES = [{"role": "user", "content": "x" * 1000}]
# 10,000 x 10,000 copies of a 1 KB message: 100 GB written out.
NESTED_LOOPS = ("{% for i in range(10000) %}{% for j in range(10000) %}"
                "{{ messages[0].content }}{% endfor %}{% endfor %}")


def _refused_quickly_and_small(template: ChatTemplate, **extra: object) -> None:
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(TemplateTooLong):
            template.render(MESSAGES, max_chars=LIMIT, **extra)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 2
    assert peak < 10 * LIMIT, peak  # a few copies of the limit at most, never the output


def test_a_template_writing_gigabytes_stops_after_the_limit() -> None:
    _refused_quickly_and_small(ChatTemplate(NESTED_LOOPS))


def test_a_generation_block_streams_within_the_limit() -> None:
    # transformers' {% generation %} block writes its body in place, read piece by piece.
    _refused_quickly_and_small(ChatTemplate(
        "{% generation %}" + NESTED_LOOPS + "{% endgeneration %}"))


def test_a_loop_count_from_template_kwargs_is_bounded_too() -> None:
    template = ChatTemplate("{% for i in range(repeat) %}{% for j in range(repeat) %}"
                            "{{ messages[0].content }}{% endfor %}{% endfor %}")
    _refused_quickly_and_small(template, repeat=100_000)


@pytest.mark.parametrize("source", [
    "{{ messages[0].content * times }}",  # one product of 1 TB
    "{{ [messages[0].content] * times }}",
    "{{ 7 ** times }}",  # an integer of thousands of GB
    "{{ messages[0].content.center(times) }}",  # padding
    "{{ messages[0].content.rjust(times) }}",
    "{{ messages[0].content | center(times) }}",
    "{{ messages[0].content | indent(times) }}",
    "{{ messages[0].content.replace('x', messages[0].content * 1000) }}",
    # transformers' tojson options: an indent or separators as wide as the limit.
    "{{ ([messages] * 1000) | tojson(indent=times) }}",
    "{{ ([messages] * 1000) | tojson(separators=(',' * 10000, ':')) }}",
])
def test_products_and_powers_past_the_limit_are_refused_before_they_are_made(
        source: str) -> None:
    _refused_quickly_and_small(ChatTemplate(source), times=10**9)


def test_string_methods_within_the_limit_work_as_before() -> None:
    template = ChatTemplate("{{ messages[0].content[:3].center(9, '*') }}|"
                            "{{ 'a\nb' | indent(2, first=true) }}|{{ 'aXb'.replace('X', '-') }}")
    assert template.render(MESSAGES, max_chars=LIMIT).text == "***xxx***|  a\n  b|a-b"


def test_output_within_the_limit_renders_as_before() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.content * 2 }}|{% endfor %}")
    bounded = template.render(MESSAGES, max_chars=2001)
    assert bounded.text == template.render(MESSAGES).text == "x" * 2000 + "|"
    with pytest.raises(TemplateTooLong):
        template.render(MESSAGES, max_chars=2000)
