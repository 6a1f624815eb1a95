"""A small reader of Dockerfiles and .dockerignore files, for the shipping tests.

No container engine runs on the test machines, so the tests check the Dockerfile by reading it:
instructions with their continuation lines joined, grouped into stages, and .dockerignore
patterns matched the way Docker matches them (the last matching pattern wins, `!` re-includes).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Instruction:
    keyword: str
    arguments: str

    def words(self) -> list[str]:
        """The arguments as a list: JSON (exec) form or shell words."""
        text = self.arguments.strip()
        if text.startswith("["):
            return list(json.loads(text))
        return shlex.split(text)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for word in instruction.words():
                key, _, value = word.partition("=")
                values[key] = value
        return values


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """The global ARGs (with defaults) and the stages of the Dockerfile at `path`."""
    logical: list[str] = []
    current = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m[1], ""), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=name))
        elif not stages and keyword == "ARG":
            key, _, value = rest.partition("=")
            args[key.strip()] = value.strip()
        else:
            stages[-1].instructions.append(Instruction(keyword, rest))
    return args, stages


def ignored(patterns: list[str], path: str) -> bool:
    """Whether `path` (relative, with /) is left out of the build context by `patterns`."""
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip("/")
        parts = path.split("/")
        # A pattern matches the path itself or any directory above it (Docker excludes a
        # directory's content with the directory); `**` matches any number of directories.
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        regex = re.compile(
            "^"
            + re.escape(pattern)
            .replace(r"/\*\*/", "(/.*)?/")
            .replace(r"\*\*", ".*")
            .replace(r"\*", "[^/]*")
            .replace(r"\?", "[^/]")
            + "$"
        )
        if any(regex.match(c) for c in candidates):
            excluded = not negate
    return excluded


def read_ignore_file(path: Path) -> list[str]:
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
