"""The generated references are current: docs/configuration.md from the settings groups and
roles, docs/api-reference.md from the API's OpenAPI document. Each generator runs in --check
mode, which rebuilds the page in memory and compares it with the file."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.shipping.support import ROOT


@pytest.mark.parametrize(
    ("script", "page"),
    [("gen-config-docs.py", "docs/configuration.md"), ("gen-api-docs.py", "docs/api-reference.md")],
)
def test_the_generated_reference_matches_the_code(script: str, page: str) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, (
        f"{page} is stale: run .venv/bin/python scripts/{script}\n{result.stderr}"
    )


def test_the_configuration_reference_names_every_option_and_its_variable() -> None:
    from notify_queue.settings import ROLE_SETTINGS

    text = (ROOT / "docs" / "configuration.md").read_text()
    for model in ROLE_SETTINGS.values():
        for field in model.model_fields:
            assert f"`NOTIFY_QUEUE_{field.upper()}`" in text, field


def test_the_configuration_reference_says_which_roles_read_each_option() -> None:
    from notify_queue.settings import ROLE_SETTINGS

    cells = [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line)]  # "\|" is a pipe inside a cell
        for line in (ROOT / "docs" / "configuration.md").read_text().splitlines()
        if line.startswith("| `--")
    ]
    rows = {row[1]: row[5] for row in cells}
    for role, model in ROLE_SETTINGS.items():
        for field in model.model_fields:
            readers = rows[f"`--{field.replace('_', '-')}`"].split(", ")
            assert role in readers or f"{role} --kubernetes" in readers, (field, role)
    assert "worker" not in rows["`--max-attempts`"].split(", ")


def test_the_api_reference_lists_every_route_of_the_contract() -> None:
    text = (ROOT / "docs" / "api-reference.md").read_text()
    for route in [
        "POST `/notifications`",
        "POST `/notifications/batch`",
        "GET `/notifications/{id}`",
        "GET `/notifications`",
        "POST `/notifications/{id}/cancel`",
        "POST `/notifications/{id}/retry`",
        "POST `/notifications/retry`",
        "GET `/status`",
        "GET `/metrics`",
        "GET `/healthz`",
        "GET `/readyz`",
    ]:
        assert f"### {route}" in text, route
