"""Writing the manifests: every file rendered into a scratch folder, which replaces the output folder at once."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..deployment import Deployment
from ..errors import UsageError
from ..fsutil import scratch_beside, swap_into_place
from ..repo import template_environment
from ._context import CONTAINER, ExportOptions, K8sContext, make_context, shell_word

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Export:
    """What ``export k8s`` wrote."""

    output_dir: Path
    #: The serving resources, in the order kustomization.yaml applies them.
    resources: list[str]
    #: Every file written (resources, kustomization.yaml, the adapter's values, the README), sorted.
    files: list[str]
    context: K8sContext


#: The folder of the build stage: its own kustomization, applied (and waited for) before the serving resources
#: (not ``build/``, which the usual .gitignore of a repository holding the manifests would leave out).
BUILD_STAGE = "build-stage"
#: The first line of every kustomization.yaml written: ``--force`` replaces only a folder whose kustomization has it.
MARKER = "# Written by trtdeploy export k8s."


def build_stage_files(ctx: K8sContext) -> list[str]:
    """The build stage's resource files (none when the deployment comes on a volume). A stage of its own: serving
    pods waiting for the build hold their GPUs, and a Job applied with them could find none free."""
    if ctx.storage.job is None:
        return []
    return ["pvc.yaml", "build-job.yaml"] if ctx.storage.create_claim else ["build-job.yaml"]


def resource_files(ctx: K8sContext) -> list[str]:
    """The serving resource files a deployment gets, in the order they are applied."""
    files = []
    if ctx.placement.multi_node:
        files += ["serviceaccount.yaml", "role.yaml", "rolebinding.yaml", "configmap.yaml"]
    files += [
        "leaderworkerset.yaml" if ctx.placement.multi_node else "deployment.yaml",
        "service.yaml",
        "service-headless.yaml",
        "pdb.yaml",
        "servicemonitor.yaml",
        "hpa.yaml",
    ]
    if ctx.gateway_name:
        files.append("grpcroute.yaml")
    return files


#: Files beside the resources, which kustomize does not apply.
EXTRA_FILES = ("prometheus-adapter-values.yaml", "README.md")


def render(ctx: K8sContext) -> dict[str, str]:
    """Every file's text by name."""
    env = template_environment(TEMPLATES)
    env.filters["q"] = json.dumps  # a YAML string (JSON's are YAML's), whatever it holds
    env.filters["quantity"] = _quantity
    env.filters["sh"] = shell_word
    resources, stage = resource_files(ctx), build_stage_files(ctx)
    variables = {"ctx": ctx, "ctx_container": CONTAINER, "resources": resources, "build_stage": stage}
    texts = {name: env.get_template(f"{name}.j2").render(**variables) for name in [*resources, *EXTRA_FILES]}
    texts["kustomization.yaml"] = env.get_template("kustomization.yaml.j2").render(**variables)
    if stage:
        for name in stage:
            texts[f"{BUILD_STAGE}/{name}"] = env.get_template(f"{name}.j2").render(**variables)
        texts[f"{BUILD_STAGE}/kustomization.yaml"] = env.get_template("kustomization.yaml.j2").render(
            **{**variables, "resources": stage}
        )
    # the templates' macros leave blank lines between blocks; YAML needs none (its scripts have none either)
    return {name: _without_blank_lines(text) if name.endswith(".yaml") else text for name, text in texts.items()}


def _is_export(folder: Path) -> bool:
    try:
        return (folder / "kustomization.yaml").read_text().startswith(MARKER)
    except OSError:
        return False


def _without_blank_lines(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if line.strip())


def _quantity(value: float) -> str:
    """A Kubernetes quantity: ``8`` or, for a fraction, milli-units (``1500m``)."""
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def export_k8s(
    deployment: Deployment, options: ExportOptions, output_dir: Path | None = None, *, force: bool = False
) -> Export:
    """Write the deployment's Kubernetes manifests into ``output_dir`` (default: ``k8s/<name>``; it must be empty or
    missing, unless ``force`` replaces it), all at once: nothing is written when anything fails."""
    ctx = make_context(deployment, options)
    output_dir = (output_dir or Path("k8s") / ctx.name).expanduser().absolute()
    if output_dir.exists() and not output_dir.is_dir():
        raise UsageError(f"--output-dir {output_dir} is a file", hint="pass a folder")
    if output_dir.is_dir() and any(output_dir.iterdir()):
        if not force:
            raise UsageError(
                f"--output-dir {output_dir} is not empty", hint="pass --force to replace it, or another --output-dir"
            )
        if not _is_export(output_dir):
            raise UsageError(
                f"--output-dir {output_dir} is not an earlier export: --force replaces only those",
                hint="pass an empty or new --output-dir",
            )
    texts = render(ctx)
    scratch = scratch_beside(
        output_dir, prefix=f".{output_dir.name}.export-", error=UsageError, hint="pass a writable --output-dir"
    )
    try:
        for name, text in texts.items():
            (scratch / name).parent.mkdir(exist_ok=True)
            (scratch / name).write_text(text)
        swap_into_place(scratch, output_dir)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return Export(output_dir, resource_files(ctx), sorted(texts), ctx)
