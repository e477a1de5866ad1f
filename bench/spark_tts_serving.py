"""Spark-TTS served by Triton and loaded by `trtdeploy perf`: RTF, average latency and first-chunk latency.

The official benchmark's shape: 26 requests per level (the wenetspeech4tts split of yuekai/seed_tts), concurrency
1, 2, 4, 8, 16, offline and streaming. Without the Hub, the inputs are the TTS workload's synthetic rows (voiced
references of 3 to 8 s, target speech of 3 to 10 s, 6.5 s on average, like the real split's 169 s over 26 rows),
and the checkpoint is a random-weight Spark-TTS-0.5B of the real size (`--size full`) whose LLM always speaks
semantic tokens and never stops on its own, so each request makes exactly its target's length of speech.

Each mode runs on a deployment built in that mode (offline: `spark_tts` on a non-decoupled LLM; streaming:
`spark_tts` on a decoupled LLM). Per level it prints
the aggregate RTF (wall time / audio seconds), the average and p50 latency, the first-chunk p50 (streaming), and
where the time went: the server time per request of audio_tokenizer and vocoder, and the rest (the LLM).

With ``--timeline`` each level is followed by where its requests' time went (see served_timeline.py).

    python bench/spark_tts_serving.py [--concurrency 1,2,4,8,16] [--modes offline,streaming] [--size tiny] [--timeline]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from served_timeline import add_timelines, print_timelines, serve
from trtdeploy_spark_tts.checkpoint import write_random_checkpoint

from trtdeploy.benchmark import PerfSettings, benchmark
from trtdeploy.build import BuildRequest
from trtdeploy.build import run as build
from trtdeploy.perf.runner import LoadSettings
from trtdeploy.perf.workload import RequestOptions

STAGES = ("audio_tokenizer", "vocoder")
#: The official table (one L20, 26 requests, 169 s of audio): concurrency -> (avg latency ms, first chunk p50, RTF).
OFFICIAL_L20 = {
    "offline": {1: (876.24, None, 0.1362), 2: (920.97, None, 0.0737), 4: (1611.51, None, 0.0704)},
    "streaming": {1: (913.28, 210.42, 0.1501), 2: (1009.23, 226.08, 0.0862), 4: (1793.86, 1017.70, 0.0824)},
}


def stage_ms(level: dict, stages: tuple[str, ...] = STAGES) -> dict[str, float]:
    """Server time per TTS request spent in each of ``stages`` (its requests x their average time / TTS
    requests), and what they leave of the average latency: the LLM and the rest (the torch engine's server
    statistics time only its ``execute``, which hands the request to the decode loop). Streaming overlaps the
    vocoder with the LLM, so there the rest undercounts the LLM."""
    models = level["server"].get("models", {})
    done = max(level["completed"], 1)
    found = {
        stage: models[stage]["requests"] * (models[stage]["avg_request_ms"] or 0.0) / done
        for stage in stages
        if stage in models
    }
    found["llm_and_rest"] = level["e2e_ms"]["mean"] - sum(found.values())
    return found


class PrintProgress:
    """One line per finished level (the run can take minutes)."""

    def start_level(self, label: str, total: int) -> None:
        self.label, self.total = label, total

    def update(self, done: int, errors: int) -> None:
        self.errors = errors

    def finish_level(self) -> None:
        print(f"  {self.label}: {self.total} requests done", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--modes", default="offline,streaming")
    parser.add_argument("--stream-concurrency", default=None, help="levels of the streaming runs (default: same)")
    parser.add_argument("--requests", type=int, default=26)
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--gpu", default="auto", help="GPU profile for the build (cpu with --size tiny)")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--temperature", type=float, default=None, help="per request (0: greedy); default: the build's")
    parser.add_argument("-o", "--option", action="append", default=[], help="model setting KEY=VALUE for the builds")
    parser.add_argument("--timeline", action="store_true", help="trace the requests: each level's time per model")
    args = parser.parse_args()
    levels = tuple(int(c) for c in args.concurrency.split(","))
    stream_levels = tuple(int(c) for c in (args.stream_concurrency or args.concurrency).split(","))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="spark-tts-serving-"))
    checkpoint = work / "Spark-TTS-0.5B"
    if not checkpoint.is_dir():
        write_random_checkpoint(checkpoint, size=args.size)
    rows = []
    for mode in args.modes.split(","):
        deployment = build(
            BuildRequest(
                model="spark_tts",
                model_dir=checkpoint,
                gpu=args.gpu,
                mode=mode,
                max_batch_size=args.max_batch_size,
                output_root=work / "deployments",
                options=dict(item.split("=", 1) for item in args.option),
            )
        ).deployment
        served, trace_file = serve(deployment, work / f"tritonserver-{mode}.log", timeline=args.timeline)
        windows = []  # per level: the level, its entry, its start and end on the monotonic clock
        with served as server:
            print(f"{mode}: {deployment.path} ({deployment.point.gpu}, {deployment.point.precision})", flush=True)
            for concurrency in stream_levels if mode == "streaming" else levels:
                start = time.monotonic_ns()
                run = benchmark(
                    PerfSettings(
                        deployment=deployment.path,
                        url=server.grpc_url,
                        load=LoadSettings(concurrency=(concurrency,), num_requests=args.requests, timeout_s=120),
                        output_dir=work / f"perf-{mode}-{concurrency}",
                        plots=False,
                        options=RequestOptions(temperature=args.temperature),
                    ),
                    progress=PrintProgress(),
                )
                (level,) = run.summary["levels"]
                windows.append((level, "spark_tts", start, time.monotonic_ns()))
                rows.append((mode, level))
        if args.timeline:
            add_timelines(trace_file, windows)
    columns = (*STAGES, "llm_and_rest")
    header = "mode       conc  req  err  audio_s  RTF     avg_ms   p50_ms   1st_p50  " + "  ".join(
        f"{stage}_ms" for stage in columns
    )
    print(header)
    for mode, level in rows:
        first = level["first_chunk_ms"]["p50"] if level["first_chunk_ms"] else float("nan")
        stages = stage_ms(level)
        print(
            f"{mode:<10} {level['concurrency']:>4} {level['requests']:>4} {level['errors']:>4} "
            f"{level['audio_seconds']:>8.1f} {level['rtf_aggregate']:.4f} {level['e2e_ms']['mean']:>8.1f} "
            f"{level['e2e_ms']['p50']:>8.1f} {first:>8.1f}  "
            + "  ".join(f"{stages.get(stage, float('nan')):>{len(stage) + 3}.1f}" for stage in columns)
        )
    if args.timeline:
        print_timelines(rows)
    print("official L20 (TRT-LLM, 26 requests): avg ms / first chunk p50 ms / RTF")
    for mode, table in OFFICIAL_L20.items():
        for conc, (avg, first, rtf) in table.items():
            print(f"  {mode:<10} {conc:>2}: {avg:8.1f} / {first or float('nan'):7.1f} / {rtf:.4f}")


if __name__ == "__main__":
    main()
