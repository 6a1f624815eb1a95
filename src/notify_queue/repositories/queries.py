"""Loads the named SQL queries from `sql/*.sql` and `citus/statements.sql` once, at import.

Each query is a block that starts with `-- name: <name>` followed by comment lines saying what it
does and why it locks what it locks. Keeping SQL in `.sql` files lets it be read, reviewed and
EXPLAINed as SQL; the repositories refer to queries by name.

A block whose name starts with `_` is a fragment, not a query: `{{_name}}` in a query is replaced
by its text. The column lists that several statements return are written once this way, and
every statement names its columns (a `*` in a prepared statement breaks when a later release
adds a column: docs/upgrading.md).

Parameters are named: `%(name)s`, and `%(name)b` for arrays. psycopg sends a `b` parameter in
binary; a text array it quotes element by element in Python (a regular expression per element),
which cost a worker three times the client CPU of the binary form for the completion's arrays.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_FRAGMENT = re.compile(r"\{\{(_\w+)\}\}")


_FRAGMENTS: dict[str, str] = {}


def _sources() -> list[Traversable]:
    """The plain statements, then the Citus coordinator's: one namespace of names."""
    root = resources.files("notify_queue.repositories")
    plain = sorted((e for e in root.joinpath("sql").iterdir() if e.name.endswith(".sql")), key=str)
    return [*plain, root.joinpath("citus", "statements.sql")]


def _load() -> dict[str, str]:
    queries: dict[str, str] = {}
    for entry in _sources():
        parts = _NAME.split(entry.read_text(encoding="utf-8"))
        for name, text in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"query {name} is defined twice")
            queries[name] = text.strip()
    fragments = {name: _without_comments(text) for name, text in queries.items() if name[0] == "_"}
    _FRAGMENTS.update(fragments)
    return {name: expand_fragments(text) for name, text in queries.items() if name[0] != "_"}


def expand_fragments(text: str) -> str:
    """`text` (a query, or SQL outside these files: citus/functions.sql) with each `{{_name}}`
    replaced by the fragment's text, fragments within it too."""
    return _FRAGMENT.sub(lambda m: expand_fragments(_FRAGMENTS[m[1]]), text)


def _without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))


QUERIES = _load()
