"""Whisper served by Triton and loaded by `trtdeploy perf`: aggregate RTF, latency p50/p99, first partial transcript.

The whole deployment path (the `whisper_bls` BLS computing log-mel features on the CPU, the torch engine's
`tensorrt_llm` model on the GPU) on whisper-large-v3 at its real size with random weights, written from its config
with the vocabulary, tokenizer and feature extractor of the plugin's random checkpoint (nothing is downloaded).
Inputs: synthetic speech drawn like LibriSpeech test-clean (2 to 35 s, about 7 s on average), each request forced
to about 3.6 tokens per second of speech (its `max_tokens`, with IGNORE_EOS), as in `whisper_engine.py`.

Offline levels run on an offline deployment, streamed ones on a streaming deployment (partial transcripts, the LLM
asked in segments). Each BLS entry runs ``--bls-instances`` instances: an offline one takes a dynamic batch at a
time, a streaming one a stream.

With ``--timeline`` each level is followed by where its requests' time went (see served_timeline.py).

    python bench/whisper_serving.py [--concurrency 1,4,16,64] [--modes offline,streaming] [--size tiny] [--timeline]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from served_timeline import add_timelines, print_timelines, serve
from trtdeploy_whisper.checkpoint import write_random_checkpoint
from whisper_engine import LARGE_V3, SAMPLE_RATE, TINY, draw_lengths, write_checkpoint

from trtdeploy.benchmark import PerfSettings, benchmark
from trtdeploy.build import BuildRequest
from trtdeploy.build import run as build
from trtdeploy.perf.report import write_wav
from trtdeploy.perf.runner import InputSpec, LoadSettings
from trtdeploy.perf.workload import RequestOptions

#: What the served checkpoint takes from the plugin's random one: everything but the weights and their config.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "added_tokens.json",
    "special_tokens_map.json", "normalizer.json", "preprocessor_config.json", "generation_config.json",
)  # fmt: skip


def write_served_checkpoint(folder: Path, shape: dict, dtype: torch.dtype) -> None:
    """Random weights of ``shape`` with the plugin checkpoint's tokenizer and feature extractor (128 mel bins)."""
    write_checkpoint(folder, shape, dtype)
    with tempfile.TemporaryDirectory() as scratch:
        write_random_checkpoint(Path(scratch), n_mels=shape["num_mel_bins"])
        for name in TOKENIZER_FILES:
            if (Path(scratch) / name).is_file():
                shutil.copy(Path(scratch) / name, folder / name)


def write_inputs(folder: Path, count: int) -> Path:
    """A jsonl of synthetic utterances (wav files beside it) with their forced output lengths."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for index, (_, tokens, audio) in enumerate(draw_lengths(count)):
        write_wav(folder / f"utt{index}.wav", audio, SAMPLE_RATE)
        rows.append({"id": f"utt{index}", "audio": f"utt{index}.wav", "max_tokens": tokens})
    path = folder / "inputs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--stream-concurrency", default="4,16", help="at most --bls-instances (one stream each)")
    parser.add_argument("--modes", default="offline,streaming")
    parser.add_argument("--precision", choices=("fp16", "bf16", "fp32"), default="fp16")
    parser.add_argument("--size", choices=("large-v3", "tiny"), default="large-v3")
    parser.add_argument("--bls-instances", type=int, default=16, help="instances of each BLS entry (-o bls_instances)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--timeline", action="store_true", help="trace the requests: each level's time per model")
    args = parser.parse_args()
    levels = {
        "offline": tuple(int(c) for c in args.concurrency.split(",")),
        "streaming": tuple(int(c) for c in args.stream_concurrency.split(",")),
    }
    modes = args.modes.split(",")
    shape = LARGE_V3 if args.size == "large-v3" else TINY
    cuda = torch.cuda.is_available()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="whisper-serving-"))
    checkpoint = work / "checkpoint"
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.precision]
    if not (checkpoint / "config.json").is_file():
        write_served_checkpoint(checkpoint, shape, dtype)
    most = max(max(levels[mode]) for mode in modes)
    count = min(max(16 * most, 64), 512)
    inputs = write_inputs(work / "inputs", count + most)  # the warmup's requests (one per slot) take rows too
    rows = []
    for mode in modes:
        deployment = build(
            BuildRequest(
                model="whisper", gpu=None if cuda else "cpu", model_dir=checkpoint, output_root=work / "deployments",
                precision=args.precision if cuda else "fp32", max_batch_size=most, mode=mode,
                options={"bls_instances": str(args.bls_instances)},
            )
        ).deployment  # fmt: skip
        served, trace_file = serve(deployment, work / f"tritonserver-{mode}.log", timeline=args.timeline, timeout=900)
        windows = []  # per level: the level, its entry, its start and end on the monotonic clock
        with served as server:
            for concurrency in levels[mode]:
                start = time.monotonic_ns()
                run = benchmark(
                    PerfSettings(
                        deployment=deployment.path,
                        url=server.grpc_url,
                        metrics_url=server.metrics_url,
                        load=LoadSettings(
                            concurrency=(concurrency,), num_requests=min(max(16 * concurrency, 64), count)
                        ),
                        inputs=InputSpec(input_data=inputs),
                        options=RequestOptions(ignore_eos=True, stream=mode == "streaming"),
                        output_dir=work / "perf" / f"{mode}-c{concurrency}",
                        plots=False,
                    )
                )
                level = run.summary["levels"][0]
                windows.append((level, "whisper_bls", start, time.monotonic_ns()))
                rows.append((mode, level))
                print(f"  {mode} c={concurrency}: done ({level['errors']} errors)", flush=True)
        if args.timeline:
            add_timelines(trace_file, windows)
    device = torch.cuda.get_device_name() if cuda else "CPU"
    print(
        f"\n{device}, whisper {args.size} (random weights), {args.precision}, torch engine; reports in {work / 'perf'}"
    )
    print(
        f"{'mode':<9} {'conc':>4} {'reqs':>5} {'err':>3} {'RTF':>7} {'p50':>8} {'p99':>8} {'first partial p50':>18}"
        f" {'BLS queue / compute':>20}"
    )
    for mode, level in rows:
        partial = level.get("first_partial_ms") or {}
        # the entry's own time per request: waiting for a free instance, then features, the LLM and the transcript
        entry = level.get("server", {}).get("models", {}).get("whisper_bls") or {}
        print(
            f"{mode:<9} {level['concurrency']:>4} {level['requests']:>5} {level['errors']:>3}"
            f" {level['rtf_aggregate']:>7.4f} {level['e2e_ms']['p50']:>6.0f}ms {level['e2e_ms']['p99']:>6.0f}ms"
            + (f" {partial['p50']:>16.0f}ms" if partial.get("p50") is not None else f" {'-':>18}")
            + f" {entry.get('avg_queue_ms') or 0:>8.1f} / {entry.get('avg_compute_ms') or 0:>7.1f}ms"
        )
    if args.timeline:
        print_timelines(rows)


if __name__ == "__main__":
    main()
