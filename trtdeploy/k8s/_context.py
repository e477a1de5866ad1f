"""Everything the Kubernetes templates say, worked out from a deployment's manifest and the export's options."""

from __future__ import annotations

import hashlib
import math
import re
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from .. import __version__, gpus
from ..deployment import Deployment
from ..errors import TrtDeployWarning, UsageError
from ..server import DEFAULT_PORTS, RESTRICTABLE_APIS, TritonBinary
from ..server._process import server_command
from ..server._serve import rank_layout
from ._build_job import build_argv

Storage = Literal["build", "volume"]
STORAGES: tuple[Storage, ...] = ("build", "volume")
ACCESS_MODES = ("ReadWriteMany", "ReadWriteOnce")
#: Where the pods (and the build Job) mount the volume that holds the model repository.
DEFAULT_MOUNT = "/models"
TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
#: The container that runs tritonserver (or, on a LeaderWorkerSet's workers, the ranks mpirun starts there).
CONTAINER = "server"
#: The restricted APIs answer only a header whose value each pod draws at start and tells no one: closed.
API_KEY_VARIABLE = "TRTDEPLOY_API_KEY"
API_KEY_HEADER = "trtdeploy-api-key"
#: The startup probe's period; its failure threshold covers the measured load time times the safety factor.
STARTUP_PERIOD_S = 10
LOAD_SAFETY_FACTOR = 3
#: The startup budget when the deployment was never served here, and the least one given.
DEFAULT_STARTUP_S = 900
MIN_STARTUP_S = 120
#: Added for a LeaderWorkerSet leader, which waits for its group's pods (pulling the image, say) before it starts.
GROUP_WAIT_S = 600
#: /dev/shm: a base plus a share per python-backend model instance (each instance's stub moves its tensors there).
SHM_BASE_MIB = 1024
SHM_PER_PYTHON_INSTANCE_MIB = 256
#: GPUs a node of any known product holds at most (HGX boards and PCIe servers alike).
MAX_GPUS_PER_NODE = 8
#: trtllm-build's --gpus_per_node, which the engines record and check against the node they run on (TRT-LLM 0.11+).
ENGINE_GPUS_PER_NODE = 8
#: The HPA scales on the requests in flight per pod (waiting or in service, in Triton or inside a backend): the rate
#: of the entry model's cumulative request time (Little's law), which prometheus-adapter serves under the name below.
HPA_SERIES = "nv_inference_request_duration_us"
HPA_METRIC = "triton_requests_in_flight"
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
#: Longest resource name: LeaderWorkerSet pods are named ``<name>-<group>-<worker>`` and must stay within 63.
MAX_NAME = 45


@dataclass(frozen=True)
class ExportOptions:
    """What ``trtdeploy export k8s`` was asked for, beyond the deployment."""

    namespace: str = "default"
    #: Pods of a Deployment, or groups of a LeaderWorkerSet, to start with (the HPA's minimum).
    replicas: int = 1
    #: The HPA's maximum (default: four times ``replicas``).
    max_replicas: int | None = None
    image: str | None = None
    name: str | None = None
    storage: Storage = "build"
    gpus_per_node: int = 8
    #: ``nvidia.com/gpu.product`` values to select (default: the GPU profile's).
    gpu_products: tuple[str, ...] = ()
    #: ``build``: the claim to create (default: ``<name>-models``), its size, class and access mode; ``volume``: the
    #: existing claim holding the deployment.
    claim: str | None = None
    storage_size: str = "200Gi"
    storage_class: str | None = None
    access_mode: str = "ReadWriteMany"
    mount_path: str = DEFAULT_MOUNT
    #: A Secret with the key ``HF_TOKEN``, for the build's download (optional).
    hf_token_secret: str | None = None
    #: ``CLAIM[:SUBPATH]`` holding the local checkpoint the deployment was built from.
    checkpoint_claim: str | None = None
    #: A Gateway (``NAME`` or ``NAMESPACE/NAME``) to attach a GRPCRoute to.
    gateway: str | None = None
    #: A perf run of this deployment: the HPA's target of requests in flight per pod is the one it recommends under
    #: the run's SLO (:func:`trtdeploy.capacity.recommend_hpa`); without one, a full batch (the max batch size).
    from_perf: Path | None = None


@dataclass(frozen=True)
class Placement:
    """GPUs per pod (0: the CPU) and the node labels that select the GPU the engines were built for."""

    gpus_per_pod: int
    products: tuple[str, ...]
    #: Pods per LeaderWorkerSet group (1: a plain Deployment).
    group_size: int

    @property
    def multi_node(self) -> bool:
        return self.group_size > 1


@dataclass(frozen=True)
class Probes:
    startup_period_s: int
    startup_failure_threshold: int
    #: The longest load ``serve`` measured (None: never served), and the budget derived from it.
    measured_load_s: float | None
    startup_budget_s: int


@dataclass(frozen=True)
class BuildJob:
    """The Job that builds the deployment into the claim. Its name and output folder carry a digest of its image
    and command, so that an export of other options or another image builds anew, beside the earlier build, rather
    than serving it (a Job's template cannot change in place either)."""

    name: str
    argv: tuple[str, ...]
    #: ``trtdeploy build ...`` as one shell line, which marks the build failed where build itself could not.
    command_line: str
    hf_token_secret: str | None
    #: The local checkpoint's claim, subpath and where it is mounted (the path it was built from), if any.
    checkpoint_claim: str | None = None
    checkpoint_subpath: str = ""
    checkpoint_path: str | None = None
    gpus: int = 0


@dataclass(frozen=True)
class ModelStorage:
    kind: Storage
    claim: str
    mount_path: str
    #: The deployment folder and its model repository as the pods see them.
    deployment_dir: str
    model_repo: str
    create_claim: bool
    size: str
    storage_class: str | None
    access_mode: str
    job: BuildJob | None


@dataclass(frozen=True)
class Autoscaling:
    metric: str
    series: str
    entry_model: str
    target_per_pod: float
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True)
class K8sContext:
    """The typed context every template of :mod:`trtdeploy.k8s` is rendered from."""

    name: str
    namespace: str
    labels: dict[str, str]
    selector: dict[str, str]
    image: str
    #: The image the Dockerfile builds it from, and whether it ships exactly the deployment's release.
    base_image: str
    base_image_exact: bool
    image_build_args: dict[str, str]
    placement: Placement
    #: The serving container's shell script (a LeaderWorkerSet leader's: mpirun across its group).
    server_script: str
    #: mpirun's rsh agent on a LeaderWorkerSet leader (empty for a Deployment).
    rsh_agent: str
    env: dict[str, str]
    shm_size: str
    python_instances: int
    probes: Probes
    storage: ModelStorage
    autoscaling: Autoscaling
    gateway_name: str | None
    gateway_namespace: str | None
    ports: dict[str, int]
    deployment_name: str
    model: str
    engine: str
    engine_version: str | None
    gpu: str
    trtdeploy_version: str
    plugin: str | None

    @property
    def kind(self) -> str:
        return "LeaderWorkerSet" if self.placement.multi_node else "Deployment"


def make_context(deployment: Deployment, options: ExportOptions) -> K8sContext:
    """Check the options against the deployment and work out every value the manifests hold (UsageError naming the
    problem and its fix otherwise)."""
    point = deployment.point
    for flag, value in (("--replicas", options.replicas), ("--gpus-per-node", options.gpus_per_node)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    max_replicas = options.max_replicas if options.max_replicas is not None else 4 * options.replicas
    if max_replicas < options.replicas:
        raise UsageError(f"--max-replicas {max_replicas} is below --replicas {options.replicas}")
    _check_names(options)
    name = _resource_name(options.name, deployment)
    if not _NAME.fullmatch(options.namespace) or len(options.namespace) > 63:
        raise UsageError(
            f"--namespace {options.namespace!r} is not a Kubernetes namespace name", hint="e.g. --namespace llm"
        )
    placement = _placement(deployment, options)
    layout = rank_layout(deployment, placement.gpus_per_pod)
    image, base_image, exact, build_args, plugin = _image(deployment, options.image)
    storage = _storage(deployment, options, name, placement, image)
    labels = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/managed-by": "trtdeploy",
    }
    selector = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "server"}
    model_repo = PurePosixPath(storage.model_repo)
    binary = TritonBinary(path=Path(TRITONSERVER))
    mpi_options: list[str] = []
    if placement.multi_node:
        mpi_options = ["-mca", "plm_rsh_agent", "/etc/trtdeploy/kubessh", "--host", "${HOSTS}"]
    command = server_command(
        binary,
        Path(model_repo),
        DEFAULT_PORTS,
        "trtdeploy-",
        host="0.0.0.0",
        restricted_apis=RESTRICTABLE_APIS,
        restricted_key=(API_KEY_HEADER, "${" + API_KEY_VARIABLE + "}"),
        mpi_options=mpi_options,
        **layout,
    )
    if layout["world_size"] > 1 or layout["orchestrator_gpus"]:
        command = ["mpirun", *command]
    gateway_namespace, _, gateway_name = (options.gateway or "").rpartition("/")
    instances = _python_instances(deployment.model_repo, max(placement.gpus_per_pod, 1))
    return K8sContext(
        name=name,
        namespace=options.namespace,
        labels=labels,
        selector=selector,
        image=image,
        base_image=base_image,
        base_image_exact=exact,
        image_build_args=build_args,
        placement=placement,
        server_script=_server_script(command, placement),
        rsh_agent=_RSH_AGENT if placement.multi_node else "",
        env=deployment.server_env,
        shm_size=_shm_size(instances),
        python_instances=instances,
        probes=_probes(deployment, placement),
        storage=storage,
        autoscaling=Autoscaling(
            metric=HPA_METRIC,
            series=HPA_SERIES,
            entry_model=deployment.entry_model,
            target_per_pod=_hpa_target(deployment, options.from_perf),
            min_replicas=options.replicas,
            max_replicas=max_replicas,
        ),
        gateway_name=gateway_name or None,
        gateway_namespace=gateway_namespace or None,
        ports=dict(zip(("http", "grpc", "metrics"), DEFAULT_PORTS, strict=True)),
        deployment_name=point.name,
        model=point.model,
        engine=point.engine,
        engine_version=point.engine_version,
        gpu=point.gpu,
        trtdeploy_version=__version__,
        plugin=plugin,
    )


#: What Kubernetes takes for object names (DNS-1123 subdomains), quantities and label values.
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _check_names(options: ExportOptions) -> None:
    """Refuse names, sizes and labels that Kubernetes would refuse at `kubectl apply`, here, by their option."""
    gateway_namespace, _, gateway = (options.gateway or "").rpartition("/")
    names = {
        "--claim": options.claim,
        "--hf-token-secret": options.hf_token_secret,
        "--checkpoint-claim": (options.checkpoint_claim or "").partition(":")[0] or None,
        "--gateway": gateway or None,
    }
    for flag, value in names.items():
        if value is not None and not _OBJECT_NAME.fullmatch(value):
            raise UsageError(
                f"{flag} {value!r} is not a Kubernetes object name", hint="lower-case letters, digits, '-' and '.'"
            )
    if gateway_namespace and not _NAME.fullmatch(gateway_namespace):
        raise UsageError(f"--gateway {options.gateway!r}: {gateway_namespace!r} is not a namespace name")
    if not _QUANTITY.fullmatch(options.storage_size):
        raise UsageError(f"--storage-size {options.storage_size!r} is not a Kubernetes quantity", hint="e.g. 200Gi")
    for product in options.gpu_products:
        if not _LABEL_VALUE.fullmatch(product):
            raise UsageError(
                f"--gpu-product {product!r} is not a label value", hint="GFD's labels read like NVIDIA-H100-80GB-HBM3"
            )


def _hpa_target(deployment: Deployment, run_dir: Path | None) -> float:
    """Requests in flight per pod the HPA holds: measured by a perf run of this deployment, or a full batch."""
    if run_dir is None:
        return float(deployment.point.max_batch_size)
    from ..capacity import hpa_target, read_curve

    curve = read_curve(run_dir)
    point = deployment.point
    if curve.build is None:
        warnings.warn(
            f"--from-perf {run_dir} records no deployment (a run of a remote server): taken as one of {point.name}",
            TrtDeployWarning,
            stacklevel=2,
        )
    else:
        measured = (curve.build.get("model"), curve.build.get("point"))
        if measured != (point.model, point.name):
            raise UsageError(
                f"--from-perf {run_dir} measured {measured[0]} {measured[1]}, not {point.model} {point.name}",
                hint=f"pass a `trtdeploy perf` run of {deployment.path}",
            )
    return hpa_target(curve).in_flight


def _resource_name(given: str | None, deployment: Deployment) -> str:
    """``--name``, or the model and point (``qwen-llm-trtllm-bf16-tp4pp1``), with a short hash when too long."""
    if given is not None:
        if not _NAME.fullmatch(given) or len(given) > MAX_NAME:
            raise UsageError(
                f"--name {given!r} is not a Kubernetes resource name of at most {MAX_NAME} characters",
                hint="lower-case letters, digits and '-', starting with a letter, e.g. qwen-tp4",
            )
        return given
    point = deployment.point
    text = re.sub(r"[^a-z0-9]+", "-", f"{point.model}-{point.name}".lower()).strip("-")
    if not text[:1].isalpha():
        text = f"m-{text}"
    if len(text) > MAX_NAME:
        digest = hashlib.sha256(text.encode()).hexdigest()[:6]
        text = f"{text[: MAX_NAME - 7].rstrip('-')}-{digest}"
    return text


def _placement(deployment: Deployment, options: ExportOptions) -> Placement:
    point = deployment.point
    if point.gpu == gpus.CPU:
        if options.gpu_products:
            raise UsageError("--gpu-product selects GPU nodes, and the deployment was built for the CPU")
        return Placement(gpus_per_pod=0, products=(), group_size=1)
    profile = gpus.PROFILES.get(point.gpu)
    products = options.gpu_products or (profile.node_labels if profile else ())
    if not products:
        raise UsageError(
            f"the deployment was built for the GPU {point.gpu!r}, whose nvidia.com/gpu.product node label is not known",
            hint="pass --gpu-product LABEL, the label GPU Feature Discovery gives those nodes (`kubectl get nodes -L "
            "nvidia.com/gpu.product`)",
        )
    per_node = options.gpus_per_node
    if profile is not None and per_node > MAX_GPUS_PER_NODE:
        raise UsageError(
            f"--gpus-per-node {per_node}: a node of {point.gpu} GPUs holds at most {MAX_GPUS_PER_NODE}",
            hint=f"pass the GPUs one node has (at most {MAX_GPUS_PER_NODE})",
        )
    needed = point.gpus_needed
    if needed <= per_node:
        return Placement(gpus_per_pod=needed, products=tuple(products), group_size=1)
    layout = f"tp{point.tp} x pp{point.pp}" + (f" x {point.replicas} replicas" if point.replicas > 1 else "")
    if deployment.server_ranks != point.world_size or point.replicas > 1:
        raise UsageError(
            f"the deployment ({layout}) needs {needed} GPUs in one pod, and a node has {per_node}",
            hint="its server runs as one process that cannot span nodes: rebuild with --replicas 1 (scale with "
            "`export k8s --replicas`) or with fewer GPUs, or pass --gpus-per-node if the nodes have more",
        )
    if needed % per_node:
        raise UsageError(
            f"the deployment ({layout}) needs {needed} GPUs, which do not split into whole nodes of {per_node}",
            hint="pass --gpus-per-node as a divisor of TP x PP that the nodes have (e.g. 8), or rebuild with another "
            "--tp/--pp",
        )
    if point.engine == "trtllm" and per_node != ENGINE_GPUS_PER_NODE:
        raise UsageError(
            f"--gpus-per-node {per_node}: the engines were built for nodes of {ENGINE_GPUS_PER_NODE} GPUs "
            "(trtllm-build's default, which TensorRT-LLM checks across nodes)",
            hint=f"spread the group over nodes of {ENGINE_GPUS_PER_NODE} GPUs",
        )
    return Placement(gpus_per_pod=per_node, products=tuple(products), group_size=needed // per_node)


def _image(deployment: Deployment, given: str | None) -> tuple[str, str, bool, dict[str, str], str | None]:
    """The serving image (``given``, else a name for the one the Dockerfile builds), the NGC image it is built from,
    whether that ships exactly the deployment's release, the Dockerfile's build arguments, and the model's plugin."""
    from ..engines.trtllm.versions import LATEST_KNOWN, TRITON_IMAGES, TrtllmVersion

    point = deployment.point
    release = point.engine_version or LATEST_KNOWN
    base, exact = TrtllmVersion.parse(release, newest=None).triton_image
    tag = base.split(":")[1].split("-")[0]
    modules = deployment.manifest.get("versions", {})
    plugin = next((name.removeprefix("trtdeploy_") for name in modules if name.startswith("trtdeploy_")), None)
    args = {"TRITON_TAG": tag, "TRTLLM_VERSION": release if release in TRITON_IMAGES else LATEST_KNOWN}
    if plugin:
        args["PLUGINS"] = plugin
    engine_part = f"trtllm{release}" if point.engine_version else point.engine
    default = f"trtdeploy:{__version__}-{engine_part}" + (f"-{plugin.replace('_', '-')}" if plugin else "")
    return given or default, base, exact, args, plugin


def _storage(
    deployment: Deployment, options: ExportOptions, name: str, placement: Placement, image: str
) -> ModelStorage:
    if options.storage not in STORAGES:
        raise UsageError(f"--storage {options.storage!r} is not one of {', '.join(STORAGES)}")
    if options.access_mode not in ACCESS_MODES:
        raise UsageError(f"--access-mode {options.access_mode!r} is not one of {', '.join(ACCESS_MODES)}")
    mount = PurePosixPath(options.mount_path)
    if not mount.is_absolute() or mount == PurePosixPath("/"):
        raise UsageError(f"--mount-path {options.mount_path!r} must be an absolute path below /", hint="e.g. /models")
    point = deployment.point
    if options.storage == "volume":
        if not options.claim:
            raise UsageError(
                "--storage volume needs --claim, the PersistentVolumeClaim holding the deployment",
                hint="pass --claim NAME, or use --storage build",
            )
        return _volume_storage(deployment, options, mount)
    if options.access_mode != "ReadWriteMany":
        raise UsageError(
            f"--access-mode {options.access_mode}: the build Job and every serving pod mount the claim, from nodes "
            "of their own",
            hint="use --access-mode ReadWriteMany, or make a claim yourself and pass --storage volume --claim NAME",
        )
    claim = options.claim or f"{name}-models"
    checkpoint_claim, _, checkpoint_subpath = (options.checkpoint_claim or "").partition(":")
    source = deployment.manifest.get("source") or {}
    checkpoint_path = source.get("path") if checkpoint_claim else None
    if checkpoint_claim and not checkpoint_path:
        raise UsageError(
            f"--checkpoint-claim {options.checkpoint_claim}: {point.name} was built from the Hub, not a local folder",
            hint="leave --checkpoint-claim out: the build Job downloads the checkpoint",
        )
    digest = hashlib.sha256(
        "\n".join([image, *build_argv(deployment, output_dir="", checkpoint_dir=checkpoint_path)]).encode()
    ).hexdigest()[:8]
    output = mount / "deployments" / digest
    argv = build_argv(deployment, output_dir=str(output), checkpoint_dir=checkpoint_path)
    deployment_dir = output / point.model / point.name.removesuffix(f"-{point.variant}")
    failed = f"{deployment_dir}.failed"
    command_line = (
        f"{shlex.join(['trtdeploy', *argv])} || {{ status=$?; if [ ! -f {shell_word(failed + '/manifest.json')} ]; "
        f'then mkdir -p {shell_word(failed)} && echo \'{{"status": "failed"}}\' > '
        f"{shell_word(failed + '/manifest.json')}; fi; exit $status; }}"
    )
    job = BuildJob(
        name=f"{name}-build-{digest}",
        argv=tuple(argv),
        command_line=command_line,
        hf_token_secret=options.hf_token_secret,
        checkpoint_claim=checkpoint_claim or None,
        checkpoint_subpath=checkpoint_subpath,
        checkpoint_path=checkpoint_path,
        gpus=placement.gpus_per_pod,
    )
    return ModelStorage(
        kind="build",
        claim=claim,
        mount_path=str(mount),
        deployment_dir=str(deployment_dir),
        model_repo=str(deployment_dir / "model_repo"),
        create_claim=True,
        size=options.storage_size,
        storage_class=options.storage_class,
        access_mode=options.access_mode,
        job=job,
    )


def _volume_storage(deployment: Deployment, options: ExportOptions, mount: PurePosixPath) -> ModelStorage:
    """An existing claim holding the deployment: mounted where this machine has it, since the model repository's
    configuration names the paths of its engines and checkpoint as they were at build time."""
    folder = PurePosixPath(deployment.path)
    recorded = [folder, PurePosixPath(deployment.checkpoint_dir), PurePosixPath(deployment.llm_dir)]
    outside = [str(path) for path in recorded if not path.is_relative_to(mount)]
    if outside:
        raise UsageError(
            f"--storage volume mounts the claim at {mount}, and the deployment's files are elsewhere: "
            f"{', '.join(outside)}",
            hint=f"build it where the volume is mounted at {mount} (with HF_HOME and TRTDEPLOY_CACHE_DIR below it) and "
            "pass --mount-path, or use --storage build",
        )
    return ModelStorage(
        kind="volume",
        claim=str(options.claim),
        mount_path=str(mount),
        deployment_dir=str(folder),
        model_repo=str(folder / "model_repo"),
        create_claim=False,
        size=options.storage_size,
        storage_class=options.storage_class,
        access_mode=options.access_mode,
        job=None,
    )


def _probes(deployment: Deployment, placement: Placement) -> Probes:
    """The startup probe's budget: the longest load ``serve`` measured times :data:`LOAD_SAFETY_FACTOR` (at least
    :data:`MIN_STARTUP_S`), or :data:`DEFAULT_STARTUP_S` when never served; plus :data:`GROUP_WAIT_S` for a group."""
    measured = max((record["seconds"] for record in deployment.load_times), default=None)
    budget = DEFAULT_STARTUP_S if measured is None else max(MIN_STARTUP_S, math.ceil(measured * LOAD_SAFETY_FACTOR))
    if placement.multi_node:
        budget += GROUP_WAIT_S
    threshold = math.ceil(budget / STARTUP_PERIOD_S)
    return Probes(STARTUP_PERIOD_S, threshold, measured, threshold * STARTUP_PERIOD_S)


def _python_instances(model_repo: Path, gpus_per_pod: int) -> int:
    """Python-backend model instances the repository starts: each ``instance_group``'s count (times the pod's GPUs
    for a KIND_GPU group that names none), one for a model without groups."""
    total = 0
    for config in sorted(model_repo.glob("*/config.pbtxt")):
        text = config.read_text()
        if not re.search(r'^\s*backend:\s*"python"', text, re.MULTILINE):
            continue
        counts = []
        for group in _instance_groups(text):
            count = int(match[1]) if (match := re.search(r"\bcount:\s*(\d+)", group)) else 1
            per_gpu = "KIND_GPU" in group and "gpus" not in group
            counts.append(count * (gpus_per_pod if per_gpu else 1))
        total += sum(counts) or 1
    return total


def _instance_groups(config: str) -> list[str]:
    """The text of each ``{...}`` in a config.pbtxt's ``instance_group [...]`` list."""
    start = re.search(r"^\s*instance_group\s*\[", config, re.MULTILINE)
    if start is None:
        return []
    groups, depth, opened = [], 0, 0
    for index in range(start.end(), len(config)):
        char = config[index]
        if char == "{":
            depth += 1
            opened = index if depth == 1 else opened
        elif char == "}":
            depth -= 1
            if depth == 0:
                groups.append(config[opened + 1 : index])
        elif char == "]" and depth == 0:
            break
    return groups


def _shm_size(python_instances: int) -> str:
    """``/dev/shm``'s size: :data:`SHM_BASE_MIB` plus :data:`SHM_PER_PYTHON_INSTANCE_MIB` per python-backend
    instance, rounded up to whole GiB."""
    mib = SHM_BASE_MIB + SHM_PER_PYTHON_INSTANCE_MIB * python_instances
    return f"{math.ceil(mib / 1024)}Gi"


def shell_word(word: str) -> str:
    """``word`` quoted for sh, its ``${NAME}`` parts left for the shell to expand."""
    parts = re.split(r"(\$\{[A-Z_]+\})", word)
    return "".join(f'"{part}"' if part.startswith("${") else shlex.quote(part) for part in parts if part) or "''"


_KEY = f"{API_KEY_VARIABLE}=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')"
_RSH_AGENT = f"""#!/bin/sh
# mpirun's rsh agent: runs the command on the pod named first, through the API server (the pods have no sshd)
pod=$1
shift
exec kubectl exec "$pod" -c {CONTAINER} -- /bin/sh -c "$*"
"""


def _server_script(command: list[str], placement: Placement) -> str:
    """The serving container's script: draw the restricted APIs' key, and on a group's leader wait until every pod
    of the group is Ready (LWS names them ``<leader>-1`` ...), then start the ranks across them."""
    lines = ["set -eu", _KEY]
    if placement.multi_node:
        slots = placement.gpus_per_pod
        lines += [
            f'HOSTS="$POD_NAME:{slots}"',
            "worker=1",
            'while [ "$worker" -lt "$LWS_GROUP_SIZE" ]; do',
            '  until kubectl wait --for=condition=Ready "pod/$POD_NAME-$worker" --timeout=60s >/dev/null 2>&1; do',
            "    sleep 2",
            "  done",
            f'  HOSTS="$HOSTS,$POD_NAME-$worker:{slots}"',
            "  worker=$((worker + 1))",
            "done",
        ]
    ranks = " ".join(shell_word(word) for word in command).split(" : ")
    lines.append("exec " + " \\\n  : ".join(ranks))
    return "\n".join(lines) + "\n"
