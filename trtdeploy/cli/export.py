"""``trtdeploy export k8s``: Kubernetes manifests for a deployment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..deployment import Deployment, find_latest
from ..k8s import ExportOptions, export_k8s
from ._options import DeploymentArg, JsonOpt
from ._output import emit_json, err, out

export = typer.Typer(help="Write a deployment out for other platforms.", no_args_is_help=True, rich_markup_mode="rich")


@export.command("k8s")
def k8s(
    deployment: DeploymentArg = None,
    *,
    output_dir: Annotated[
        Path | None, typer.Option(help="Folder to write (default: k8s/<name> under the current folder).")
    ] = None,
    namespace: Annotated[str, typer.Option(help="Namespace of every resource.")] = "default",
    name: Annotated[
        str | None, typer.Option(help="Name of the resources (default: the model and the deployment's point).")
    ] = None,
    replicas: Annotated[
        int, typer.Option(help="Serving pods (a LeaderWorkerSet: groups) to start with: the HPA's minimum.")
    ] = 1,
    max_replicas: Annotated[int | None, typer.Option(help="The HPA's maximum (default: 4 x --replicas).")] = None,
    image: Annotated[
        str | None,
        typer.Option(help="Serving image (default: a name for the one docker/Dockerfile builds; README.md says how)."),
    ] = None,
    gpus_per_node: Annotated[
        int, typer.Option(help="GPUs a node has: TP x PP above it spreads over a LeaderWorkerSet group.")
    ] = 8,
    gpu_product: Annotated[
        list[str] | None,
        typer.Option(help="nvidia.com/gpu.product node label to select (repeatable; default: the GPU profile's)."),
    ] = None,
    storage: Annotated[
        str,
        typer.Option(
            help="How the model repository reaches the pods: build (a Job builds it in the cluster into a new "
            "claim) or volume (an existing claim holding it, --claim)."
        ),
    ] = "build",
    claim: Annotated[
        str | None,
        typer.Option(help="PersistentVolumeClaim to create (build; default <name>-models) or to read (volume)."),
    ] = None,
    storage_size: Annotated[str, typer.Option(help="Size of the claim a build creates.")] = "200Gi",
    storage_class: Annotated[
        str | None, typer.Option(help="Storage class of that claim (default: the cluster's).")
    ] = None,
    access_mode: Annotated[
        str, typer.Option(help="Access mode of that claim: ReadWriteMany (pods on several nodes) or ReadWriteOnce.")
    ] = "ReadWriteMany",
    mount_path: Annotated[
        str, typer.Option(help="Where the pods mount the claim (volume: where this machine has it mounted too).")
    ] = "/models",
    hf_token_secret: Annotated[
        str | None, typer.Option(help="Secret whose key HF_TOKEN the build downloads with (gated checkpoints).")
    ] = None,
    checkpoint_claim: Annotated[
        str | None,
        typer.Option(help="CLAIM[:SUBPATH] holding the local checkpoint the deployment was built from (build)."),
    ] = None,
    gateway: Annotated[
        str | None, typer.Option(help="Gateway ([NAMESPACE/]NAME) to route gRPC through: adds a GRPCRoute.")
    ] = None,
    from_perf: Annotated[
        Path | None,
        typer.Option(
            help="A `trtdeploy perf` run of DEPLOYMENT with an SLO: the HPA holds the requests in flight per pod it "
            "recommends (default: a full batch).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --output-dir.")] = False,
    json: JsonOpt = False,
) -> None:
    """Kubernetes manifests for DEPLOYMENT, with a kustomization.yaml: workload, storage, probes, Services, HPA."""
    dep = Deployment.load(deployment) if deployment is not None else find_latest()
    options = ExportOptions(
        namespace=namespace,
        replicas=replicas,
        max_replicas=max_replicas,
        image=image,
        name=name,
        storage=storage,  # type: ignore[arg-type]  # checked with the other options
        gpus_per_node=gpus_per_node,
        gpu_products=tuple(gpu_product or ()),
        claim=claim,
        storage_size=storage_size,
        storage_class=storage_class,
        access_mode=access_mode,
        mount_path=mount_path,
        hf_token_secret=hf_token_secret,
        checkpoint_claim=checkpoint_claim,
        gateway=gateway,
        from_perf=from_perf,
    )
    written = export_k8s(dep, options, output_dir, force=force)
    if json:
        emit_json({"output_dir": str(written.output_dir), "kind": written.context.kind, "files": written.files})
        return
    where = escape(str(written.output_dir))
    out.print(f"[green]✓[/] {where}: a {written.context.kind} and {len(written.resources) - 1} more resources")
    for file in written.files:
        out.print(f"  {escape(file)}")
    staged = written.context.storage.job is not None
    steps = "apply build-stage/, wait for its Job, then apply the folder" if staged else "`kubectl apply -k`"
    err.print(f"Next: build the image, then {steps} (README.md there says how).")
