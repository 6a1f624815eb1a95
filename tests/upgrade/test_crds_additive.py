"""The CRDs change additively only (docs/upgrading.md): everything the baseline release's CRDs
accepted, this checkout's still accept, so objects written for the previous release, and the
previous operator's status patches, stay valid after `helm upgrade` replaces the CRDs.

Compared structurally against `git show <baseline>:crds/<file>`: every version still served,
every property still there with its type, every enum value still allowed, no new required field,
no tighter bound, no changed pattern, no new CEL rule. A rule that must change goes through a new
version of the API, not an edit of v1alpha1. One exception: a field that names another object may
gain the pattern Kubernetes itself requires of that object's name (REFERENCE_PATTERNS), which
refuses only names no object can have, and the path traversals they allowed (docs/security.md).
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import yaml

from notify_queue.services.kube import OBJECT_NAME_PATTERN, SECRET_KEY_PATTERN
from tests.upgrade.baseline import REPO_ROOT, baseline_commit

CRD_DIR = REPO_ROOT / "crds"
_UPPER = ("maxLength", "maximum", "maxItems", "maxProperties")
_LOWER = ("minLength", "minimum", "minItems", "minProperties")
# A DNS-1123 subdomain (a Secret's or one of our objects' name) and a Secret's key.
REFERENCE_PATTERNS = {OBJECT_NAME_PATTERN, SECRET_KEY_PATTERN}


def narrowed(old: dict[str, Any], new: dict[str, Any], path: str = "") -> list[str]:
    """What `new` rejects that `old` accepted, one line per finding (empty: additive)."""
    found: list[str] = []
    if old.get("type") != new.get("type"):
        found.append(f"{path}: type {old.get('type')} -> {new.get('type')}")
    if "enum" in new:
        lost = [v for v in old.get("enum", [None]) if v not in new["enum"]]
        if "enum" not in old or lost:
            found.append(f"{path}: enum no longer allows {lost if 'enum' in old else 'any value'}")
    added = set(new.get("required", [])) - set(old.get("required", []))
    if added:
        found.append(f"{path}: newly required {sorted(added)}")
    for key in _UPPER:
        if key in new and (key not in old or new[key] < old[key]):
            found.append(f"{path}: {key} {old.get(key)} -> {new[key]}")
    for key in _LOWER:
        if key in new and (key not in old or new[key] > old[key]):
            found.append(f"{path}: {key} {old.get(key)} -> {new[key]}")
    for key in ("pattern", "format", "oneOf", "anyOf", "allOf", "not"):
        if key in new and new.get(key) != old.get(key):
            if key == "pattern" and key not in old and new[key] in REFERENCE_PATTERNS:
                continue  # a name no object can have was never a working reference
            found.append(f"{path}: {key} changed")
    old_rules = {r["rule"] for r in old.get("x-kubernetes-validations", [])}
    for rule in new.get("x-kubernetes-validations", []):
        if rule["rule"] not in old_rules:
            found.append(f"{path}: new CEL rule {rule['rule']!r}")
    if old.get("x-kubernetes-preserve-unknown-fields") and not new.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        found.append(f"{path}: unknown fields no longer preserved")
    for name, schema in old.get("properties", {}).items():
        if name not in new.get("properties", {}):
            if not new.get("x-kubernetes-preserve-unknown-fields"):
                found.append(f"{path}.{name}: removed")
            continue
        found += narrowed(schema, new["properties"][name], f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(old.get(key), dict):
            if not isinstance(new.get(key), dict):
                found.append(f"{path}.{key}: removed or changed")
            else:
                found += narrowed(old[key], new[key], f"{path}.{key}[]")
    return found


def crd_narrowed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    found: list[str] = []
    if old["spec"]["names"] != {**new["spec"]["names"], **old["spec"]["names"]}:
        found.append("names changed")
    if old["spec"]["scope"] != new["spec"]["scope"]:
        found.append("scope changed")
    versions = {v["name"]: v for v in new["spec"]["versions"]}
    for version in old["spec"]["versions"]:
        if not version.get("served"):
            continue
        current = versions.get(version["name"])
        if current is None or not current.get("served"):
            found.append(f"{version['name']}: no longer served")
            continue
        if version.get("subresources") and current.get("subresources") != version["subresources"]:
            found.append(f"{version['name']}: subresources changed")
        found += narrowed(
            version["schema"]["openAPIV3Schema"],
            current["schema"]["openAPIV3Schema"],
            version["name"],
        )
    return found


def _baseline(name: str) -> dict[str, Any]:
    text = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "show", f"{baseline_commit()}:crds/{name}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(yaml.safe_load(text))


def _current(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def test_every_crd_accepts_whatever_the_baseline_release_accepted() -> None:
    old_names = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-tree", "--name-only", baseline_commit(), "crds/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert old_names, "the baseline has no CRDs?"
    for name in (Path(n).name for n in old_names):
        assert (CRD_DIR / name).exists(), f"{name} was removed"
        assert crd_narrowed(_baseline(name), _current(CRD_DIR / name)) == [], name


def test_the_check_finds_a_narrowed_schema() -> None:
    # The checker itself can fail: narrow a copy of today's Notification CRD in the usual ways.
    old = _current(CRD_DIR / "notifications.yaml")
    new = copy.deepcopy(old)
    schema = new["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema["properties"]["priority"]["enum"].remove("LOW")
    schema["required"] = [*schema.get("required", []), "subject"]
    schema["properties"]["recipient"]["maxLength"] = 10
    del schema["properties"]["metadata"]
    # A reference's name pattern may be added; any other pattern is a narrowing.
    schema["properties"]["category"]["pattern"] = OBJECT_NAME_PATTERN
    schema["properties"]["recipientId"]["pattern"] = "^[a-z]+$"
    found = crd_narrowed(old, new)
    assert len(found) == 5, found
    assert any("recipientId: pattern changed" in f for f in found), found
