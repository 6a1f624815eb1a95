"""Template bounds: each kind of template bomb is refused by the rule that covers it, in the
sandbox (services.sandbox) or by the render process's time and memory limits
(services.rendering), and honest templates render as before.
"""

from __future__ import annotations

from typing import Any

import pytest

from notify_queue.errors import TemplateRenderFailed, ValidationFailed
from notify_queue.models import Channel
from notify_queue.services.rendering import InlineRenderer, RenderPool
from notify_queue.services.sandbox import (
    MAX_RANGE_LENGTH,
    RULE_DEPTH,
    RULE_MEMORY,
    RULE_NUMBER,
    RULE_OUTPUT,
    RULE_RANGE,
    RULE_SIZE,
    RULE_TIME,
    render_parts,
)
from notify_queue.services.templates import check_template_channels, render

# Each bomb, and the rule that must name it. A bound that failed open would take seconds and
# gigabytes here (the tests run in this process), so every one of these must be refused early.
SANDBOX_BOMBS: dict[str, tuple[str, str]] = {
    "string repetition": ("{{ 'x' * 10**9 }}", RULE_SIZE),
    "repetition on the left": ("{{ 10**9 * 'x' }}", RULE_SIZE),
    "list repetition": ("{{ ([1] * 10**9)|length }}", RULE_SIZE),
    "power": ("{{ 9 ** (9 ** 9) }}", RULE_NUMBER),
    "squaring in a loop": (
        "{% set ns = namespace(x=10**100) %}"
        "{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x }}",
        RULE_NUMBER,
    ),
    "concatenation doubling": (
        "{% set ns = namespace(s='x') %}"
        "{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        RULE_SIZE,
    ),
    "addition doubling": (
        "{% set ns = namespace(s=['x']) %}"
        "{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
        RULE_SIZE,
    ),
    "center filter": ("{{ 'x'|center(10**9) }}", RULE_SIZE),
    "center method": ("{{ 'x'.center(10**9) }}", RULE_SIZE),
    "ljust method": ("{{ 'x'.ljust(10**9) }}", RULE_SIZE),
    "zfill method": ("{{ '1'.zfill(10**9) }}", RULE_SIZE),
    "expandtabs": ("{{ ('\t' * 1000).expandtabs(10**6) }}", RULE_SIZE),
    "percent width": ("{{ '%0999999999d' % 1 }}", RULE_SIZE),
    "percent star width": ("{{ '%*d' % (999999999, 1) }}", RULE_SIZE),
    "format filter": ("{{ '%*s'|format(999999999, 'x') }}", RULE_SIZE),
    "str.format width": ("{{ '{:>999999999}'.format(1) }}", RULE_SIZE),
    "str.format nested width": ("{{ '{:>{}}'.format(1, 999999999) }}", RULE_SIZE),
    "replace filter": ("{{ ('x' * 100000)|replace('', 'y' * 100) }}", RULE_SIZE),
    "replace method": ("{{ ('x' * 100000).replace('x', 'y' * 1000) }}", RULE_SIZE),
    "join filter": ("{{ (['x' * 900000] * 1000)|join }}", RULE_SIZE),
    "join method": ("{{ ''.join(['x' * 900000] * 1000) }}", RULE_SIZE),
    "wordwrap": ("{{ ('x ' * 100000)|wordwrap(1, wrapstring='y' * 1000) }}", RULE_SIZE),
    "indent": ("{{ ('x\n' * 1000)|indent(10**6) }}", RULE_SIZE),
    "batch fill": ("{{ [1]|batch(10**9, 'x')|list }}", RULE_SIZE),
    "range": ("{% for i in range(10**9) %}{% endfor %}", RULE_RANGE),
    "output": ("{% for i in range(10000) %}{{ 'y' * 1000 }}{% endfor %}", RULE_OUTPUT),
    "recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", RULE_DEPTH),
}


@pytest.mark.parametrize("source, rule", SANDBOX_BOMBS.values(), ids=SANDBOX_BOMBS.keys())
def test_each_sandbox_bomb_is_refused_by_its_rule(source: str, rule: str) -> None:
    outcome = render_parts({"body": (source, 65_536)}, {})
    assert outcome["error"]["kind"] == "bound", outcome
    assert outcome["error"]["rule"] == rule, outcome
    assert rule in outcome["error"]["message"]


def test_a_range_at_the_bound_renders() -> None:
    source = f"{{{{ range({MAX_RANGE_LENGTH})|list|length }}}}"
    assert render_parts({"body": (source, 100)}, {}) == {"texts": {"body": str(MAX_RANGE_LENGTH)}}


def test_honest_templates_render_as_before() -> None:
    source = (
        "Hi {{ name|title }}: {{ '%5.1f'|format(total) }} {{ 'a' ~ 'b' }} {{ items|join(', ') }} "
        "{{ 2 ** 10 }} {{ 'ab' * 3 }} {{ '{:>4}'.format(7) }} {{ 'x'|center(5) }}|"
        "{% for i in range(3) %}{{ i }}{% endfor %} {{ (items + ['z'])|length }} {{ 7 % 3 }}"
    )
    outcome = render_parts(
        {"body": (source, 1000)}, {"name": "ann", "total": 3.14159, "items": ["p", "q"]}
    )
    assert outcome == {"texts": {"body": "Hi Ann:   3.1 ab p, q 1024 ababab    7   x  |012 3 1"}}


def test_data_errors_are_told_apart_from_bounds_and_forbidden_code() -> None:
    def error(source: str) -> dict[str, Any]:
        return render_parts({"body": (source, 100)}, {})["error"]  # type: ignore[no-any-return]

    assert error("{{ missing }}")["kind"] == "data"
    assert error("{{ 1 / 0 }}") == {
        "part": "body",
        "kind": "data",
        "rule": None,
        "message": "ZeroDivisionError: division by zero",
    }
    assert error("{{ ''.__class__.__mro__ }}")["kind"] == "template"


async def test_a_bound_at_creation_is_a_400_on_the_template_naming_the_rule() -> None:
    channels = {"email": {"subject": "Hi", "body": "{{ 'x' * 10**9 }}"}}
    with pytest.raises(ValidationFailed) as caught:
        await render(
            InlineRenderer(), channels, Channel.EMAIL, {}, field_prefix="notifications[2]."
        )
    [error] = caught.value.errors
    assert error.field == "notifications[2].template"
    assert error.message.startswith(f"email body: exceeds the {RULE_SIZE} bound")


async def test_an_output_over_the_cap_is_the_old_message_with_the_rule() -> None:
    channels = {"email": {"subject": "{{ 'x' * 999 }}", "body": "ok"}}
    with pytest.raises(ValidationFailed) as caught:
        await render(InlineRenderer(), channels, Channel.EMAIL, {})
    [error] = caught.value.errors
    assert (error.field, error.message) == (
        "data",
        f"email subject renders over 998 characters ({RULE_OUTPUT} bound)",
    )


# -- the worker processes -------------------------------------------------------------------

TIME_BOMBS = {
    "nested ranges": (
        "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}"
    ),
    "nested loops over data": (
        "{% for a in x %}{% for b in x %}{% for c in x %}{{ '' }}{% endfor %}{% endfor %}"
        "{% endfor %}"
    ),
}


async def test_a_render_past_the_time_limit_is_stopped_and_its_worker_replaced() -> None:
    pool = RenderPool(processes=1, timeout_seconds=0.5)
    try:
        assert await pool.render({"body": ("warm {{ 1 }}", 100)}, {}) == {"body": "warm 1"}
        for source in TIME_BOMBS.values():
            with pytest.raises(TemplateRenderFailed) as caught:
                await pool.render({"body": (source, 100)}, {"x": list(range(1000))})
            assert (caught.value.kind, caught.value.rule) == ("bound", RULE_TIME)
            # The one worker was killed; the next render gets a new one, and an answer.
            assert await pool.render({"body": ("after {{ n }}", 100)}, {"n": 1}) == {
                "body": "after 1"
            }
    finally:
        await pool.close()


async def test_a_render_past_the_memory_limit_is_refused_and_the_worker_goes_on() -> None:
    # Each value is within the sandbox's size bound; together they pass the address-space limit.
    hoard = (
        "{% set ns = namespace(l=[]) %}"
        "{% for i in range(10000) %}{% set _ = ns.l.append([0] * 999999) %}{% endfor %}"
    )
    # A time limit no loaded machine reaches: this is about the memory limit alone.
    pool = RenderPool(processes=1, memory_bytes=64 * 1024 * 1024, timeout_seconds=60)
    try:
        with pytest.raises(TemplateRenderFailed) as caught:
            await pool.render({"body": (hoard, 100)}, {})
        assert (caught.value.kind, caught.value.rule) == ("bound", RULE_MEMORY)
        assert await pool.render({"body": ("after", 100)}, {}) == {"body": "after"}
    finally:
        await pool.close()


async def test_the_pool_answers_sandbox_refusals_and_data_errors_like_the_sandbox() -> None:
    pool = RenderPool(processes=1)
    try:
        with pytest.raises(TemplateRenderFailed) as caught:
            await pool.render({"subject": ("ok", 100), "body": ("{{ 'x' * 10**9 }}", 100)}, {})
        assert (caught.value.part, caught.value.rule) == ("body", RULE_SIZE)
        with pytest.raises(TemplateRenderFailed) as missing:
            await pool.render({"body": ("{{ nobody }}", 100)}, {})
        assert (missing.value.kind, missing.value.message) == ("data", "'nobody' is undefined")
    finally:
        await pool.close()


def test_a_template_too_deeply_nested_to_parse_is_refused_at_put() -> None:
    # Parsing recurses per level; 0.1.0 let the RecursionError out as a 500.
    nested = "{{ " + "(" * 2000 + "1" + ")" * 2000 + " }}"
    with pytest.raises(ValidationFailed) as caught:
        check_template_channels({"sms": {"body": nested}})
    assert [(e.field, e.message) for e in caught.value.errors] == [
        ("channels.sms.body", "nests too deeply")
    ]
