"""The torch engine served by Triton and loaded by `trtdeploy perf`: TTFT, ITL and output tokens/s per concurrency.

Writes a random-weight Qwen2.5-0.5B-shaped checkpoint (no download), builds a streaming deployment with the torch
engine, serves it on the bundled tritonserver and runs `trtdeploy perf` (synthetic prompts of exactly --isl tokens,
exactly --osl output tokens) against the LLM contract model (``tensorrt_llm``: token ids in and out) and the text
``ensemble`` (tokenizer and detokenizer around it). Prints TTFT p50, ITL p50 and output tokens/s per level, and ITL
at concurrency 1 against the bandwidth bound (weight bytes / HBM bandwidth of a device-to-device copy).

With ``--replicas N`` the deployment has an instance on each of N GPUs, and each level also prints each GPU's mean
utilization while it ran (``nvidia-smi``, sampled every 100 ms).

    python bench/torch_engine_serving.py [--concurrency 1,4,16,64] [--isl 128] [--osl 256] [--replicas 1] [--tiny]
        [-o cuda_graphs=false ...]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch_engine_decode import QWEN25_05B, TINY, hbm_bandwidth

from trtdeploy.benchmark import PerfSettings, benchmark
from trtdeploy.build import BuildRequest
from trtdeploy.build import run as build
from trtdeploy.checkpoints import TinyShape, write_random_causal_lm
from trtdeploy.perf.runner import InputSpec, LoadSettings
from trtdeploy.perf.workload import RequestOptions
from trtdeploy.server import launch

#: Qwen2.5-7B's shape: a step at high concurrency heavy enough for the GPU, not the server, to be the limit.
QWEN25_7B = {
    **QWEN25_05B,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}


def weight_bytes(checkpoint: Path) -> int:
    """Bytes of every tensor read per decode step (all weights; a tied embedding counts once)."""
    from safetensors import safe_open

    total = 0
    for path in checkpoint.glob("*.safetensors"):
        with safe_open(str(path), "pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                total += tensor.numel() * tensor.element_size()
    return total


@contextmanager
def gpu_utilization(samples: list[list[float]]):
    """Each GPU's utilization (%) every 100 ms while the block runs, appended to ``samples`` (one row per GPU)."""
    query = ["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"]
    sampler = subprocess.Popen(query, stdout=subprocess.PIPE, text=True)
    try:
        yield
    finally:
        sampler.terminate()
        output, _ = sampler.communicate()
        for line in output.splitlines():
            index, value = (int(field) for field in line.split(","))
            while len(samples) <= index:
                samples.append([])
            samples[index].append(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=256)
    parser.add_argument("--models", default="tensorrt_llm,ensemble")
    parser.add_argument("--replicas", type=int, default=1, help="an instance on each of this many GPUs")
    parser.add_argument("--requests-per-slot", type=int, default=None, help="measured requests per level / concurrency")
    parser.add_argument("--workers", type=int, default=1, help="perf client processes")
    parser.add_argument("-o", "--option", action="append", default=[], help="build -o KEY=VALUE (repeatable)")
    parser.add_argument("--shape", choices=("0.5b", "7b"), default="0.5b", help="Qwen2.5-0.5B's or -7B's shape")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model, to try the script on a CPU")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    levels = tuple(int(c) for c in args.concurrency.split(","))
    shape = TINY if args.tiny else QWEN25_7B if args.shape == "7b" else QWEN25_05B
    cuda = torch.cuda.is_available()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="torch-serving-"))
    checkpoint = work / "checkpoint"
    if not checkpoint.is_dir():
        fields = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
        tiny = TinyShape(**{k: shape[k] for k in fields}, vocab_size=shape["vocab_size"])
        write_random_causal_lm(
            checkpoint,
            shape=tiny,
            max_position_embeddings=32768,
            dtype="bfloat16",
            config={"tie_word_embeddings": shape["tie_word_embeddings"]},
        )
    deployment = build(
        BuildRequest(
            model="qwen_llm",
            gpu=None if cuda else "cpu",
            model_dir=checkpoint,
            output_root=work / "deployments",
            max_batch_size=max(levels),
            max_input_len=args.isl,
            max_output_len=args.osl,
            replicas=args.replicas,
            options=dict(option.split("=", 1) for option in args.option),
        )
    ).deployment
    bound_ms = None
    if cuda:
        bound_ms = weight_bytes(checkpoint) / hbm_bandwidth(torch.device("cuda")) * 1e3
    rows = []
    with launch(deployment.model_repo, models=deployment.models, log_file=work / "tritonserver.log") as server:
        for model in args.models.split(","):
            # one run per level when GPUs are sampled, so that each level's samples are its own
            for group in [(c,) for c in levels] if args.replicas > 1 else [levels]:
                samples: list[list[float]] = []
                with gpu_utilization(samples) if args.replicas > 1 else nullcontext():
                    run = benchmark(
                        PerfSettings(
                            deployment=deployment.path,
                            url=server.grpc_url,
                            metrics_url=server.metrics_url,
                            model=model,
                            load=LoadSettings(
                                concurrency=group,
                                num_requests=args.requests_per_slot and args.requests_per_slot * max(group),
                                warmup=args.requests_per_slot and max(group),
                                workers=args.workers,
                            ),
                            inputs=InputSpec(isl=args.isl, osl=args.osl),
                            options=RequestOptions(ignore_eos=True),
                            output_dir=work / "perf" / model / "-".join(map(str, group)),
                            plots=False,
                        )
                    )
                busy = " / ".join(f"{sum(column) / len(column):.0f}%" for column in samples if column)
                for level in run.summary["levels"]:
                    rows.append((model, level, busy))
    device = torch.cuda.get_device_name() if cuda else "CPU"
    print(
        f"\n{device}, {deployment.point.precision}, isl {args.isl}, osl {args.osl}, {args.replicas} replica(s); "
        f"reports in {work / 'perf'}"
    )
    print(
        f"{'model':<13} {'conc':>4} {'reqs':>5} {'err':>3} {'TTFT p50':>9} {'ITL p50':>8} {'out tok/s':>10}"
        f" {'client CPU':>10}  GPU utilization"
    )
    for model, level, busy in rows:
        print(
            f"{model:<13} {level['concurrency']:>4} {level['requests']:>5} {level['errors']:>3}"
            f" {level['ttft_ms']['p50']:>7.2f}ms {level['itl_ms']['p50']:>6.3f}ms"
            f" {level['output_token_throughput']:>10,.0f} {level['client_cpu_utilization']:>10.0%}  {busy}"
        )
    if bound_ms is not None:
        print(f"bandwidth bound {bound_ms:.3f} ms/token (weights / copy bandwidth)")
        for model, level, _ in rows:
            if level["concurrency"] == 1:
                print(f"{model}: ITL p50 at concurrency 1 = {level['itl_ms']['p50'] / bound_ms:.1f} x the bound")


if __name__ == "__main__":
    main()
