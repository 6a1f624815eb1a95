"""The one `main` of the generators (gen-*.py): write the generated file, or with --check
compare it with what the code would generate now and say how to refresh it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_or_check(path: Path, text: str, argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        if not path.exists() or path.read_text() != text:
            script = Path(argv[0]).name
            print(f"{path.relative_to(ROOT)} is stale; run scripts/{script}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    return 0
