"""Helpers of the shipping tests: helm and kubectl as subprocesses, rendered manifests as dicts."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "notify-queue"
FULL_VALUES = Path(__file__).resolve().parent / "fixtures" / "full-values.yaml"
MONITORING_CRDS = Path(__file__).resolve().parent / "fixtures" / "monitoring-crds.yaml"
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Namespace"}


@dataclass(frozen=True)
class Tools:
    bin_dir: Path

    def run(
        self,
        tool: str,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / tool), *args]
        if kubeconfig is not None:
            command += ["--kubeconfig", str(kubeconfig)]
        result = subprocess.run(
            command, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            command_line = " ".join(args)
            raise AssertionError(
                f"{tool} {command_line} exited {result.returncode}:\n"
                f"{result.stderr}\n{result.stdout[-2000:]}"
            )
        return result

    def helm(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run("helm", *args, **kwargs)

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", *args, **kwargs)

    def template(
        self,
        *extra: str,
        values: Sequence[Path] = (),
        set_values: Mapping[str, str] | None = None,
        namespace: str = "notify-queue",
        release: str = "nq",
        kubeconfig: Path | None = None,
    ) -> list[dict[str, Any]]:
        """`helm template` of the chart, as a list of objects."""
        args = ["template", release, str(CHART), "--namespace", namespace, *extra]
        for file in values:
            args += ["--values", str(file)]
        for key, value in (set_values or {}).items():
            args += ["--set", f"{key}={value}"]
        return documents(self.helm(*args, kubeconfig=kubeconfig).stdout)

    def json(self, *args: str, kubeconfig: Path) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json", kubeconfig=kubeconfig).stdout)

    def namespace(self, kubeconfig: Path, *, prefix: str = "ship", restricted: bool = True) -> str:
        """A new namespace; `restricted`: Pod Security "restricted" enforced and warned about."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name, kubeconfig=kubeconfig)
        if restricted:
            self.kubectl(
                "label",
                "namespace",
                name,
                "pod-security.kubernetes.io/enforce=restricted",
                "pod-security.kubernetes.io/enforce-version=latest",
                "pod-security.kubernetes.io/warn=restricted",
                "pod-security.kubernetes.io/warn-version=latest",
                kubeconfig=kubeconfig,
            )
        return name


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def dump(objects: Sequence[Mapping[str, Any]]) -> str:
    return yaml.safe_dump_all(list(objects), sort_keys=False)


def of_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: Sequence[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for o in objects:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError(
        f"no {kind} {name} in {[(o['kind'], o['metadata']['name']) for o in objects]}"
    )


def pod_specs(objects: Sequence[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(object name, pod spec) of every object that makes pods."""
    for o in objects:
        if o["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"]


def helm_values_of_hooks(obj: Mapping[str, Any]) -> set[str]:
    hooks = (obj["metadata"].get("annotations") or {}).get("helm.sh/hook", "")
    return {h.strip() for h in hooks.split(",") if h.strip()}
