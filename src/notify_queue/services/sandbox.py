"""The template sandbox: Jinja2's `SandboxedEnvironment` with every operation that can make a
value grow out of proportion bounded, and the render of one template's parts with its data.

Jinja2's sandbox stops a template reaching Python internals, not a template using all the memory
or all the time there is: `{{ 'x' * 10**9 }}`, `{{ 9**9**9 }}`, `{{ 'x'|center(10**9) }}`, a
string doubled in a loop. So every operation whose result can be much larger than its inputs is
checked BEFORE it runs where its size is known from its arguments (`*`, `**`, `%`, widths of
`center`/`ljust`/`format` specs, `join`, `replace`, `wordwrap`, `batch`...), and every result of
an operator, concatenation (`~`), filter or call is checked AFTER, so growth stops at the first
step past the bound; `range` is bounded; a field's output is streamed (`generate()`) and stops at
its cap. A bound crossed raises `BoundExceeded` naming the rule.

These checks are cheap, and they name the rule for the known bombs; they cannot see everything
(nested loops over data only take time). The backstop is the process the render runs in
(services.rendering): a wall-clock limit that kills it, and an address-space limit.

This module imports only Jinja2: it is what the render worker process loads.
"""

from __future__ import annotations

import functools
import math
import re
import string
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jinja2 import StrictUndefined, Template, TemplateError, UndefinedError
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.nodes import Concat
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment

# The largest string (characters) or sequence (items) one operation may build. A field's
# output is capped at 64 KiB (MAX_BODY_BYTES), so 1,000,000 leaves room for any honest
# intermediate value, while one value stays a few megabytes: growth is refused long before it
# reaches the memory limit.
MAX_VALUE_LENGTH = 1_000_000
# The largest integer an operation may build, in bits (about 1,230 decimal digits). No message
# needs more, and `9**9**9` would take minutes of CPU and hundreds of megabytes to compute.
MAX_INT_BITS = 4096
# The longest `range`: Jinja2's own bound is 100,000; a message listing more than 10,000 items
# cannot fit in its 64 KiB anyway, and nested ranges multiply.
MAX_RANGE_LENGTH = 10_000

# The rules a render can break, as named in the 400 (and in a permanent failure).
RULE_SIZE = "value size"
RULE_NUMBER = "number size"
RULE_RANGE = "range length"
RULE_OUTPUT = "output size"
RULE_DEPTH = "recursion depth"
RULE_TIME = "render time"
RULE_MEMORY = "render memory"


class BoundExceeded(Exception):
    """A template crossed one of the render bounds; `rule` names which."""

    def __init__(self, rule: str, detail: str) -> None:
        self.rule = rule
        self.detail = detail
        super().__init__(f"exceeds the {rule} bound: {detail}")


def _size(value: Any) -> int | None:
    """How big a value is for the bounds: characters, items, or None when not sized."""
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        return len(value)
    return None


def _check_length(length: int, what: str = "a value") -> None:
    if length > MAX_VALUE_LENGTH:
        raise BoundExceeded(
            RULE_SIZE, f"{what} of {length} items or characters, at most {MAX_VALUE_LENGTH}"
        )


def _check_int(value: Any) -> None:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise BoundExceeded(RULE_NUMBER, f"an integer over {MAX_INT_BITS} bits")


def _checked(value: Any) -> Any:
    """`value` when it is within the bounds; raise otherwise (after an operation ran)."""
    size = _size(value)
    if size is not None:
        _check_length(size)
    else:
        _check_int(value)
    return value


def _as_count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_multiply(left: Any, right: Any) -> None:
    for sized, times in ((left, right), (right, left)):
        size, count = _size(sized), _as_count(times)
        if size is not None and count is not None:
            _check_length(size * max(count, 0), "a repetition")
            return
    a, b = _as_count(left), _as_count(right)
    if a is not None and b is not None and a.bit_length() + b.bit_length() > MAX_INT_BITS:
        raise BoundExceeded(RULE_NUMBER, f"a product over {MAX_INT_BITS} bits")


def _check_power(base: Any, exponent: Any) -> None:
    b, e = _as_count(base), _as_count(exponent)
    if b is None or e is None or e <= 0 or abs(b) <= 1:
        return  # floats overflow to an error of their own; a negative exponent gives a float
    if e * math.log2(abs(b)) > MAX_INT_BITS:
        raise BoundExceeded(RULE_NUMBER, f"a power over {MAX_INT_BITS} bits")


_DIGITS = re.compile(r"\d+")


def _percent_widths(fmt: str) -> Iterator[str]:
    """Each %-conversion's width and precision ('*' or digits), read as `str % args` reads
    them: left to right, a mapping key up to its matching parenthesis (`%(a(b)c)08d`). One pass:
    a pattern rescanned an unclosed key from every `%` (quadratic, docs/security.md)."""
    i, n = 0, len(fmt)
    while (i := fmt.find("%", i)) != -1:
        i += 1
        if fmt.startswith("(", i):
            depth, i = 1, i + 1
            while i < n and depth:
                depth += {"(": 1, ")": -1}.get(fmt[i], 0)
                i += 1
            if depth:
                return  # an incomplete key: formatting raises
        while i < n and fmt[i] in "-#0 +":
            i += 1
        for part in ("width", "precision"):
            if part == "precision":
                if not fmt.startswith(".", i):
                    break
                i += 1
            if fmt.startswith("*", i):
                yield "*"
                i += 1
                continue
            start = i
            while i < n and "0" <= fmt[i] <= "9":
                i += 1
            if i > start:
                yield fmt[start:i]
        i += 1  # the conversion character (`%%` included)


def _check_percent(fmt: str, args: Any) -> None:
    """`fmt % args` cannot pad a value to more than the bound (`'%0999999999d' % 1`)."""
    star = False
    for group in _percent_widths(fmt):
        if group == "*":
            star = True
        elif int(group) > MAX_VALUE_LENGTH:
            _check_length(int(group), "a formatting width")
    if star:
        for arg in args if isinstance(args, tuple) else (args,):
            count = _as_count(arg)
            if count is not None:
                _check_length(abs(count), "a formatting width")


def _check_format_spec(fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """`fmt.format(...)` cannot pad a value to more than the bound (`'{:>999999999}'`)."""
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if not spec:
            continue
        for digits in _DIGITS.findall(spec):
            _check_length(int(digits), "a formatting width")
        if "{" in spec:  # a width taken from the arguments
            for arg in (*args, *kwargs.values()):
                count = _as_count(arg)
                if count is not None:
                    _check_length(abs(count), "a formatting width")


def _check_join(items: Any, separator: str = "") -> Any:
    """The items as a list, when joined they stay within the bound."""
    materialised = list(items)
    total = len(separator) * max(len(materialised) - 1, 0)
    for item in materialised:
        total += len(item) if isinstance(item, str) else 1
    _check_length(total, "a join")
    return materialised


def _check_replace(text: str, old: str, new: str, count: Any = -1) -> None:
    hits = text.count(old) if old else len(text) + 1
    limit = _as_count(count)
    if limit is not None and limit >= 0:
        hits = min(hits, limit)
    _check_length(len(text) + hits * max(len(new) - len(old), 0), "a replace")


def _check_width(width: Any) -> None:
    count = _as_count(width)
    if count is not None:
        _check_length(count, "a padding width")


def _check_str_method(method: types.BuiltinMethodType, args: tuple[Any, ...]) -> None:
    """Pre-checks of the str methods whose result size comes from an argument."""
    text = method.__self__
    assert isinstance(text, str)
    name = method.__name__
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _check_width(args[0])
    elif name == "expandtabs" and args and _as_count(args[0]) is not None:
        _check_length(len(text) + text.count("\t") * max(args[0], 0), "a tab expansion")
    elif name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        _check_replace(text, args[0], args[1], *args[2:3])
    elif name == "join" and args:
        _check_join(args[0], text)


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` with the pre-checks of filter `name` and its result checked."""

    @functools.wraps(function)  # keeps `jinja_pass_arg` (context/environment passing)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        # Filters passed the context or environment get it first; the value follows.
        offset = 1 if hasattr(function, "jinja_pass_arg") else 0
        value, rest = (args[offset], args[offset + 1 :]) if len(args) > offset else (None, ())
        if name in ("center", "indent") and rest:
            width = rest[0]
            lines = value.count("\n") + 1 if isinstance(value, str) else 1
            if isinstance(width, str):
                _check_length(len(width) * lines, "an indent")
            elif _as_count(width) is not None:
                _check_length(width * lines, "a padding width")
        elif name == "format" and isinstance(value, str):
            _check_percent(value, tuple(rest) or tuple(kwargs.values()))
        elif name == "replace" and isinstance(value, str) and len(rest) >= 2:
            _check_replace(value, str(rest[0]), str(rest[1]), *rest[2:3])
        elif name == "wordwrap" and isinstance(value, str):
            wrap = kwargs.get("wrapstring", rest[2] if len(rest) > 2 else "\n")
            _check_length(len(value) * (1 + len(str(wrap or "\n"))), "a wordwrap")
        elif name in ("batch", "slice") and rest:
            _check_width(rest[0])
        elif name == "join" and value is not None and not isinstance(value, str):
            separator = rest[0] if rest else kwargs.get("d", "")
            args = (*args[:offset], _check_join(value, str(separator)), *rest)
        return _checked(function(*args, **kwargs))

    return bounded


def bounded_range(*args: int) -> range:
    """`range` of at most MAX_RANGE_LENGTH numbers."""
    numbers = range(*args)
    if len(numbers) > MAX_RANGE_LENGTH:
        raise BoundExceeded(
            RULE_RANGE, f"a range of {len(numbers)} numbers, at most {MAX_RANGE_LENGTH}"
        )
    return numbers


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja2's code generator, with concatenation (`~`) checked like the operators: the sandbox
    cannot intercept it, and doubling a string in a loop (`ns.s ~ ns.s`) grows as fast as `*`."""

    def visit_Concat(self, node: Concat, frame: Frame) -> None:
        self.write("environment.bounded_value(")
        super().visit_Concat(node, frame)
        self.write(")")


class BoundedEnvironment(SandboxedEnvironment):
    """The sandbox with the bounds above on operators, concatenation, filters, calls and range."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self) -> None:
        super().__init__(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
        self.globals["range"] = bounded_range
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}

    def bounded_value(self, value: Any) -> Any:
        return _checked(value)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            _check_multiply(left, right)
        elif operator == "**":
            _check_power(left, right)
        elif operator == "%" and isinstance(left, str):
            _check_percent(left, right)
        return _checked(self.binop_table[operator](left, right))

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(__obj, types.BuiltinMethodType) and isinstance(
            getattr(__obj, "__self__", None), str
        ):
            _check_str_method(__obj, args)
        return _checked(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt: str = value.__self__

        def bounded(*args: Any, **kwargs: Any) -> str:
            if value.__name__ == "format":
                _check_format_spec(fmt, args, kwargs)
            elif args and isinstance(args[0], Mapping):
                _check_format_spec(fmt, (), args[0])
            return str(_checked(wrapped(*args, **kwargs)))

        return bounded


ENVIRONMENT = BoundedEnvironment()


@functools.lru_cache(maxsize=256)
def _compiled(source: str) -> Template:
    """A template compiled once per process: compiling costs tens of times more than rendering
    (benchmarks/probes/template_render.py); the templates in use at once are far fewer than 256."""
    return ENVIRONMENT.from_string(source)


def render_text(source: str, data: Mapping[str, Any], *, max_chars: int) -> str:
    """`source` rendered with `data`, streamed and stopped once over `max_chars` characters."""
    chunks: list[str] = []
    length = 0
    for chunk in _compiled(source).generate(dict(data)):
        length += len(chunk)
        if length > max_chars:
            raise BoundExceeded(RULE_OUTPUT, f"renders over {max_chars} characters")
        chunks.append(chunk)
    return "".join(chunks)


def render_parts(parts: Mapping[str, tuple[str, int]], data: Mapping[str, Any]) -> dict[str, Any]:
    """Render each named part (source, output cap in characters) with `data`.

    The outcome is plain JSON, the same in this process or in a render worker:
    `{"texts": {part: text}}`, or `{"error": {"part", "kind", "rule", "message"}}` for the first
    part that failed, `kind` being `data` (the data does not fit the template: a missing
    variable, a division by zero), `template` (the template does something forbidden) or
    `bound` (a render bound, `rule` naming it).
    """
    texts: dict[str, str] = {}
    for part, (source, max_chars) in parts.items():
        try:
            texts[part] = render_text(source, data, max_chars=max_chars)
        except BoundExceeded as exc:
            return _error(part, "bound", str(exc), exc.rule)
        except MemoryError:
            # The compiled templates count against the same memory limit: dropped, so that many
            # big templates cannot leave a worker unable to render anything.
            _compiled.cache_clear()
            return _error(part, "bound", memory_message(), RULE_MEMORY)
        except RecursionError:
            return _error(part, "bound", f"exceeds the {RULE_DEPTH} bound", RULE_DEPTH)
        except UndefinedError as exc:
            return _error(part, "data", str(exc.message))
        except SecurityError as exc:
            return _error(part, "template", str(exc))
        except TemplateError as exc:
            return _error(part, "data", str(exc.message))
        except Exception as exc:  # the data does not suit the template: 1/0, int('x'), ...
            return _error(part, "data", f"{type(exc).__name__}: {exc}"[:500])
    return {"texts": texts}


def memory_message() -> str:
    return f"exceeds the {RULE_MEMORY} bound"


def _error(part: str, kind: str, message: str, rule: str | None = None) -> dict[str, Any]:
    return {"error": {"part": part, "kind": kind, "rule": rule, "message": message}}
