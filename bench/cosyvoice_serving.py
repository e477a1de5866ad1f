"""CosyVoice served by Triton and loaded by `trtdeploy perf`: RTF, latency, first chunk, each stage's share, and
the most streams one GPU holds.

The official benchmark's shape: 26 requests per level, concurrency 1, 2, 4, 8, 16, offline and streaming. Without
the Hub, the inputs are the TTS workload's synthetic rows (voiced references of 3 to 8 s, target speech of 3 to
10 s, 6.5 s on average, like the seed_tts split's 169 s over 26 rows), and the checkpoint is a random-weight one of
the released size (`--size full`: the Qwen2-0.5B LLM with the converted vocabulary of 158,336 or 158,720 tokens,
flow and HiFT, the speech tokenizer; the speaker encoder stays small) whose LLM never stops on its own, so each
request makes exactly its target's length of speech (25 speech tokens a second).

Both modes run on one streaming deployment: offline levels load `<entry>_offline`, streaming ones the entry. After
the official levels, streaming goes on upward (`--search`, max(26, 2 x concurrency) requests a level) until the RTF
p95 (per request: its latency over its audio) passes 1 or the first chunk's p95 passes 1 s; the last level holding
both is the deployment's streaming capacity. The deployment runs one entry instance per stream of the highest level
(`-o bls_instances`, each serves one request at a time) and `--max-batch-size` LLM slots.

Per level it prints the aggregate RTF (wall time / audio seconds), the per-request RTF p95, the average and p50
latency, the first chunk p50/p95 (streaming), and where the time of a request went: the server time per request of
the speech tokenizer, the speaker encoder, token2wav (and CosyVoice3's vocoder), and the rest: the LLM (whose server
statistics time only the hand-off to its decode loop) and the entry's own work (text normalisation and prompt mel, a
few ms).

With ``--timeline`` each level is followed by where its requests' time went (see served_timeline.py).

    python bench/cosyvoice_serving.py [--generation cosyvoice2] [--concurrency 1,2,4,8,16] [--size tiny] [--timeline]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from served_timeline import add_timelines, print_timelines, serve
from spark_tts_serving import stage_ms
from trtdeploy_cosyvoice.checkpoint import write_random_checkpoint

from trtdeploy.benchmark import PerfSettings, benchmark
from trtdeploy.build import BuildRequest
from trtdeploy.build import run as build
from trtdeploy.perf.runner import LoadSettings
from trtdeploy.perf.workload import RequestOptions

#: The official CosyVoice2 table (one L20, TensorRT-LLM, 26 requests): concurrency -> (first chunk p50 ms, RTF).
OFFICIAL_L20 = {
    "offline": {1: (None, 0.089), 2: (None, 0.066), 4: (None, 0.061)},
    "streaming": {1: (220.0, 0.124)},
}
#: The limits of the streaming search: per-request RTF p95 and first-chunk p95 (ms).
RTF_LIMIT = 1.0
FIRST_CHUNK_LIMIT_MS = 1000.0


STARTED = time.monotonic()


def clock() -> str:
    """Seconds since the script started (where a run's time goes)."""
    return f"{time.monotonic() - STARTED:.0f} s"


def stages(generation: str) -> tuple[str, ...]:
    models = ("reference_voice", "token2wav")  # the first runs audio_tokenizer and speaker_embedding side by side
    return (*models, "vocoder") if generation == "cosyvoice3" else models


def holds(level: dict) -> bool:
    """Whether a streaming level kept every request's RTF p95 under 1 and its first chunk p95 under 1 s."""
    rtf, first = level["rtf"], level["first_chunk_ms"]
    return (
        level["errors"] == 0
        and rtf is not None
        and rtf["p95"] < RTF_LIMIT
        and first is not None
        and first["p95"] < FIRST_CHUNK_LIMIT_MS
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generation", choices=("cosyvoice2", "cosyvoice3"), default="cosyvoice2")
    parser.add_argument("--concurrency", default="1,2,4,8,16", help="the official levels, both modes")
    parser.add_argument("--modes", default="offline,streaming")
    parser.add_argument("--search", default="24,32,48,64,96,128,160", help="streaming levels upward ('': none)")
    parser.add_argument("--requests", type=int, default=26)
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--gpu", default="auto", help="GPU profile for the build (cpu with --size tiny)")
    parser.add_argument("--max-batch-size", type=int, default=128, help="LLM slots and token2wav batch")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("-o", "--option", action="append", default=[], help="model setting KEY=VALUE for the build")
    parser.add_argument("--timeline", action="store_true", help="trace the requests: each level's time per model")
    args = parser.parse_args()
    levels = tuple(int(c) for c in args.concurrency.split(","))
    search = tuple(int(c) for c in args.search.split(",") if c)
    generation = args.generation
    work = args.workdir or Path(tempfile.mkdtemp(prefix=f"{generation}-serving-"))
    checkpoint = work / generation
    if not checkpoint.is_dir():
        print(f"writing a random {args.size} {generation} checkpoint into {checkpoint}", flush=True)
        write_random_checkpoint(checkpoint, generation, size=args.size, stops=False)
        print(f"written at {clock()}", flush=True)
    options = {"bls_instances": str(max((*levels, *search))), "offline_instances": str(max(levels))}
    options.update(item.split("=", 1) for item in args.option)
    deployment = build(
        BuildRequest(
            model=generation,
            model_dir=checkpoint,
            gpu=args.gpu,
            mode="streaming",
            max_batch_size=args.max_batch_size,
            output_root=work / "deployments",
            options=options,
        )
    ).deployment
    print(f"built {deployment.path} ({deployment.point.gpu}, {deployment.point.precision}) at {clock()}", flush=True)
    rows: list[tuple[str, dict]] = []
    windows: list[tuple[dict, str, int, int]] = []  # per level: the level, its entry, its start and end
    models = stages(generation)
    served, trace_file = serve(deployment, work / "tritonserver.log", timeline=args.timeline)
    with served as server:
        print(f"serving at {clock()}", flush=True)
        print_header(models)

        def run(mode: str, concurrency: int, requests: int) -> dict:
            start = time.monotonic_ns()
            entry = generation if mode == "streaming" else f"{generation}_offline"
            (level,) = benchmark(
                PerfSettings(
                    deployment=deployment.path,
                    url=server.grpc_url,
                    model=entry,
                    load=LoadSettings(concurrency=(concurrency,), num_requests=requests, timeout_s=300),
                    output_dir=work / f"perf-{mode}-{concurrency}",
                    plots=False,
                    options=RequestOptions(),
                )
            ).summary["levels"]
            windows.append((level, entry, start, time.monotonic_ns()))
            rows.append((mode, level))
            print_row(mode, level, models)
            return level

        modes = args.modes.split(",")
        capacity = 0
        for mode in modes:
            for concurrency in levels:
                level = run(mode, concurrency, args.requests)
                if mode == "streaming" and holds(level):
                    capacity = max(capacity, concurrency)
        if "streaming" in modes and capacity == max(levels):
            for concurrency in search:
                if not holds(run("streaming", concurrency, max(args.requests, 2 * concurrency))):
                    break
                capacity = concurrency
    if args.timeline:
        add_timelines(trace_file, windows)
        print_timelines(rows)
    at_least = "at least " if search and capacity == search[-1] else ""
    print(
        f"streaming capacity: {at_least}{capacity} concurrent streams with RTF p95 < {RTF_LIMIT:g} and first chunk "
        f"p95 < {FIRST_CHUNK_LIMIT_MS:g} ms (done at {clock()})"
    )
    print("official L20 (TensorRT-LLM, 26 requests): first chunk p50 ms / RTF")
    for mode, table in OFFICIAL_L20.items():
        for conc, (first, rtf) in table.items():
            print(f"  {mode:<10} {conc:>2}: {first or float('nan'):7.1f} / {rtf:.3f}")
    levels_out = [dict(level, mode=mode) for mode, level in rows]
    (work / "summary.json").write_text(json.dumps({"capacity": capacity, "levels": levels_out}, indent=2))
    print(f"levels: {work / 'summary.json'}")


def print_header(models: tuple[str, ...]) -> None:
    print(
        "mode       conc  req  err  audio_s  RTF     RTFp95  avg_ms   p50_ms   1st_p50  1st_p95  "
        + "  ".join(f"{column}_ms" for column in (*models, "llm_and_rest")),
        flush=True,
    )


def print_row(mode: str, level: dict, models: tuple[str, ...]) -> None:
    head = f"{mode:<10} {level['concurrency']:>4} {level['requests']:>4} {level['errors']:>4} "
    if level["e2e_ms"] is None:
        print(head + " (no request done)", flush=True)
        return
    first = level["first_chunk_ms"] or {"p50": float("nan"), "p95": float("nan")}
    rtf_p95 = level["rtf"]["p95"] if level["rtf"] else float("nan")
    shares = stage_ms(level, models)
    print(
        head + f"{level['audio_seconds']:>8.1f} {level['rtf_aggregate'] or float('nan'):.4f} {rtf_p95:.4f} "
        f"{level['e2e_ms']['mean']:>8.1f} {level['e2e_ms']['p50']:>8.1f} "
        f"{first['p50']:>8.1f} {first['p95']:>8.1f}  "
        + "  ".join(
            f"{shares.get(column, float('nan')):>{len(column) + 3}.1f}" for column in (*models, "llm_and_rest")
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
