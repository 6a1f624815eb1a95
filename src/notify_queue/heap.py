"""A role's process hands what it built at start-up to the collector's permanent generation.

CPython's cyclic collector scans every tracked object in its oldest generation on each full
collection. A role process holds hundreds of thousands of such objects for its whole life (the
modules, FastAPI's routes and schemas, pydantic's validators, the pools) and allocates many
short-lived ones per request and per delivery, so its full collections kept rescanning the
start-up heap: 16% of the API's CPU per batch item (docs/performance.md, "The API path").
`gc.freeze()` moves everything alive at that moment out of the collector's view; it is still
freed by reference counting, and only a cycle among those objects would now never be collected,
which for what lives as long as the process changes nothing.

The youngest generation is collected after 10,000 new tracked objects instead of CPython's 700.
A worker keeps hundreds of deliveries in flight and the API a batch of a thousand items, all
young and alive for a few milliseconds: every young collection traced them and moved them on to
be traced again in the next generation, work that found no garbage. Garbage in cycles waits a
little longer (at most the objects allocated meanwhile, a few MB); everything else is freed by
reference counting as before. Measured in alternating runs (docs/performance.md, "The
collector's youngest generation"): a drain of 30,000 by two workers 11,604-12,238 ->
12,260-13,921 notifications/s, the API's CPU per batch item 38.7-39.0 -> 37.0-37.8 us.

Only in a role's own process (`enable`, called by the CLI and by the API's worker-process
factory): a test that runs a role inside its own process keeps its collector as it was.
"""

from __future__ import annotations

import gc

_enabled = False
# Tracked objects allocated (net of those freed) before the youngest generation is collected.
YOUNG_THRESHOLD = 10_000


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
        gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
