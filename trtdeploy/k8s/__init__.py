"""Kubernetes manifests for a deployment (``trtdeploy export k8s``): a Deployment, or a LeaderWorkerSet where TP x PP
spans nodes, with its model repository built in the cluster or mounted from a volume, probes, Services, a
PodDisruptionBudget, a ServiceMonitor and an HPA on a Triton metric, all rendered from the deployment's manifest."""

from ._build_job import build_argv
from ._context import ExportOptions, K8sContext, make_context, shell_word
from ._export import Export, export_k8s, render, resource_files

__all__ = [
    "Export",
    "ExportOptions",
    "K8sContext",
    "build_argv",
    "export_k8s",
    "make_context",
    "render",
    "resource_files",
    "shell_word",
]
