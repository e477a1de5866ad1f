"""The ``trtdeploy build`` command line that builds a deployment again, from its manifest alone."""

from __future__ import annotations

from typing import Any

from ..deployment import Deployment
from ..errors import UsageError


def _option_text(value: Any) -> str:
    """A ``-o KEY=VALUE`` value as the model's option parser reads it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def build_argv(deployment: Deployment, *, output_dir: str, checkpoint_dir: str | None = None) -> list[str]:
    """``trtdeploy build`` arguments (without the program) that plan the deployment's build point again, into
    ``output_dir``: the same model, engine, GPU, precision, limits, parallelism, engine options, model options and
    toolkit release, from the checkpoint the manifest names (the Hub repository at the very commit it was built from,
    or ``checkpoint_dir``, the local folder it was built from as the build sees it).

    A point of a matrix over lengths loses its variant suffix: one build of those lengths has none.
    """
    point = deployment.point
    gpu = "cpu" if point.gpu == "cpu" else f"{point.gpu}:{point.gpus_needed}"
    argv = [
        "build",
        point.model,
        f"--engine={point.engine}",
        f"--gpu={gpu}",
        f"--precision={point.precision}",
        f"--max-batch-size={point.max_batch_size}",
        f"--tp={point.tp}",
        f"--pp={point.pp}",
        f"--replicas={point.replicas}",
        f"--mode={point.mode}",
        f"--max-input-len={point.max_input_len}",
        f"--max-output-len={point.max_output_len}",
        f"--max-num-tokens={point.max_num_tokens}",
    ]
    if point.engine_version:
        argv.append(f"--trtllm-version={point.engine_version}")
    if point.kv_cache_dtype:
        argv.append(f"--kv-cache-dtype={point.kv_cache_dtype}")
    if point.calib_size:
        argv.append(f"--calib-size={point.calib_size}")
    if point.calib_dataset:
        raise UsageError(
            f"the deployment was calibrated on the local dataset {point.calib_dataset}, which a build in the cluster "
            "cannot read",
            hint="use --storage volume with a volume holding the deployment, or rebuild it without --calib-dataset",
        )
    source = deployment.manifest.get("source") or {}
    if source.get("repo_id"):
        argv.append(f"--revision={source['commit']}")
    elif checkpoint_dir is not None:
        argv.append(f"--model-dir={checkpoint_dir}")
    else:
        raise UsageError(
            f"the deployment was built from the local checkpoint {source.get('path', deployment.checkpoint_dir)}, "
            "which a build in the cluster cannot download",
            hint="put that folder on a volume and pass --checkpoint-claim CLAIM[:SUBPATH], or use --storage volume",
        )
    for key, value in (*point.options, *point.engine_options):
        argv += ["-o", f"{key}={_option_text(value)}"]
    return [*argv, f"--output-dir={output_dir}"]
