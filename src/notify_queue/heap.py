"""A role's process hands what it built at start-up to the collector's permanent generation.

CPython's cyclic collector scans every tracked object in its oldest generation on each full
collection. A role process holds hundreds of thousands of such objects for its whole life (the
modules, FastAPI's routes and schemas, pydantic's validators, the pools) and allocates many
short-lived ones per request and per delivery, so its full collections kept rescanning the
start-up heap, a large share of the API's CPU per batch item (docs/performance.md).
`gc.freeze()` moves everything alive at that moment out of the collector's view; it is still
freed by reference counting, and only a cycle among those objects would now never be collected,
which for what lives as long as the process changes nothing.

Only in a role's own process (`enable`, called by the CLI and by the API's worker-process
factory): a test that runs a role inside its own process keeps its collector as it was.
"""

from __future__ import annotations

import gc

_enabled = False


def enable() -> None:
    """This process runs one role (or `up`) for its life: `settle` freezes its start-up heap."""
    global _enabled
    _enabled = True


def settle() -> None:
    """Called once a role is set up, before it serves: collect start-up garbage, then freeze
    what is left. Again later (another role of `up`) freezes what was built since."""
    if _enabled:
        gc.collect()
        gc.freeze()
