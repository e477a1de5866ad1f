"""How fast can `trtdeploy perf` drive Triton from one CPU core, and what latency does it add?

Serves the trivial python-backend echo models of bench/models/ (offline ``echo``, decoupled ``echo_decoupled``)
on the bundled tritonserver, pins this process to one core (the server to the others), and loads them at a fixed
concurrency with

- ``perf``: trtdeploy's load generator (``trtdeploy.perf.runner.run_levels``), and
- ``bare``: the simplest tritonclient aio loop: ``asyncio.gather`` of N loops awaiting ``client.infer``
  (streaming: N loops, each on its own ``client.stream_infer`` stream).

It prints requests/s (offline) and chunks/s (streaming) of both, their ratio (goal: perf >= 90% of bare), and the
latency the client adds per request at p50: client-side E2E p50 minus Triton's average request time over the same
run (goal: <= 0.5 ms). Run: ``python bench/client_overhead.py [--requests N] [--concurrency C] [--chunks K]``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from trtdeploy.perf.control import ControlClient
from trtdeploy.perf.runner import Endpoint, LoadSettings, run_levels
from trtdeploy.perf.stats import server_delta, snapshot
from trtdeploy.perf.workload import Chunk, InputRow, ModelInfo, Request, RequestOptions, Result, Workload
from trtdeploy.server import launch

MODELS = Path(__file__).parent / "models"
PAYLOAD = np.arange(16, dtype=np.int32)


class EchoWorkload(Workload):
    """Sends INPUT0 (and CHUNKS to the decoupled echo); each response counts as one token."""

    def __init__(self, model_name: str, *, decoupled: bool, chunks: int = 1) -> None:
        self.model_name = model_name
        self.decoupled = decoupled
        self.chunks = chunks

    def make_request(self, row: InputRow, options: RequestOptions, model: ModelInfo) -> Request:
        inputs = {"INPUT0": PAYLOAD}
        if self.decoupled:
            inputs["CHUNKS"] = np.array([self.chunks], dtype=np.int32)
        return Request(inputs=inputs, outputs=("OUTPUT0",))

    def parse_chunk(self, outputs: Mapping[str, np.ndarray], request: Request) -> Chunk:
        return Chunk(tokens=1)

    def finish(self, request: Request, chunks: Sequence[Chunk]) -> Result:
        return Result(output_tokens=len(chunks), first_chunk_tokens=1 if chunks else None, token_source="server")


def _inputs(decoupled: bool, chunks: int) -> list:
    import tritonclient.grpc as grpcclient

    data = grpcclient.InferInput("INPUT0", list(PAYLOAD.shape), "INT32")
    data.set_data_from_numpy(PAYLOAD)
    if not decoupled:
        return [data]
    count = grpcclient.InferInput("CHUNKS", [1], "INT32")
    count.set_data_from_numpy(np.array([chunks], dtype=np.int32))
    return [data, count]


async def bare_offline(url: str, concurrency: int, requests: int) -> tuple[float, float, list[float], int]:
    """(window s, CPU s, per-request latencies in ms, responses) of N plain ``await client.infer`` loops."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    inputs = _inputs(False, 1)
    latencies: list[float] = []
    per_loop = requests // concurrency

    async def loop() -> None:
        for _ in range(per_loop):
            sent = time.perf_counter_ns()
            await client.infer("echo", inputs)
            latencies.append((time.perf_counter_ns() - sent) / 1e6)

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    window, cpu = time.perf_counter() - start, time.process_time() - cpu
    await client.close()
    return window, cpu, latencies, len(latencies)


async def bare_streaming(
    url: str, concurrency: int, requests: int, chunks: int
) -> tuple[float, float, list[float], int]:
    """(window s, CPU s, per-request latencies in ms, responses) of N loops, one stream each."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    inputs = _inputs(True, chunks)
    latencies: list[float] = []
    received = 0
    per_loop = requests // concurrency

    async def loop() -> None:
        nonlocal received
        queue: asyncio.Queue = asyncio.Queue()

        async def requests_iterator():
            while (item := await queue.get()) is not None:
                yield item

        responses = client.stream_infer(requests_iterator())
        for index in range(per_loop):
            sent = time.perf_counter_ns()
            await queue.put({"model_name": "echo_decoupled", "inputs": inputs, "request_id": str(index)})
            async for result, error in responses:
                if error is not None:
                    raise error
                received += 1
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            latencies.append((time.perf_counter_ns() - sent) / 1e6)
        await queue.put(None)
        responses.cancel()

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    window, cpu = time.perf_counter() - start, time.process_time() - cpu
    await client.close()
    return window, cpu, latencies, received


async def measure_bare(url: str, model: str, concurrency: int, requests: int, chunks: int) -> dict[str, float]:
    control = ControlClient("grpc", url)
    before = await snapshot(control, None)
    if model == "echo":
        window, cpu, latencies, received = await bare_offline(url, concurrency, requests)
    else:
        window, cpu, latencies, received = await bare_streaming(url, concurrency, requests, chunks)
    await asyncio.sleep(0.05)
    server = server_delta(before, await snapshot(control, None))["models"][model]
    await control.close()
    return {
        "req/s": len(latencies) / window,
        "chunks/s": received / window,
        "e2e_p50_ms": statistics.median(latencies),
        "e2e_mean_ms": statistics.fmean(latencies),
        "server_ms": server["avg_request_ms"],
        "cpu": cpu / window,
        "cpu_us": cpu / len(latencies) * 1e6,
    }


async def measure_perf(url: str, model: str, concurrency: int, requests: int, chunks: int) -> dict[str, float]:
    workload = EchoWorkload(model, decoupled=model != "echo", chunks=chunks)
    load = LoadSettings(concurrency=(concurrency,), num_requests=requests, warmup=0)
    run = await run_levels(workload, [InputRow(input="")], Endpoint(url, "grpc"), load)
    level = run.summary["levels"][0]
    assert level["errors"] == 0, level["error_messages"]
    return {
        "req/s": level["request_throughput"],
        "chunks/s": level["output_token_throughput"],
        "e2e_p50_ms": level["e2e_ms"]["p50"],
        "e2e_mean_ms": level["e2e_ms"]["mean"],
        "server_ms": level["server"]["models"][model]["avg_request_ms"],
        "cpu": level["client_cpu_utilization"],
        "cpu_us": level["client_cpu_s"] / level["requests"] * 1e6,
    }


def measure_perf_analyzer(binary: str, url: str, model: str, concurrency: int, chunks: int) -> dict[str, float]:
    """perf_analyzer's own figures for the same model and concurrency (its 3-window stable measurement)."""
    data = {"INPUT0": {"content": PAYLOAD.tolist(), "shape": list(PAYLOAD.shape)}}
    if model != "echo":
        data["CHUNKS"] = {"content": [chunks], "shape": [1]}
    with tempfile.TemporaryDirectory() as tmp:
        inputs, report_csv = Path(tmp) / "inputs.json", Path(tmp) / "pa.csv"
        inputs.write_text(json.dumps({"data": [data]}))
        command = [
            binary, "-m", model, "-u", url, "-i", "grpc", "--concurrency-range", str(concurrency),
            "--input-data", str(inputs), "--percentile=50", "-f", str(report_csv),
            "--measurement-mode", "count_windows", "--measurement-request-count", "20000",
            "--stability-percentage", "20", "--max-trials", "10",
        ]  # fmt: skip
        if model != "echo":
            command.append("--streaming")
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"perf_analyzer exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
        row = next(csv.DictReader(report_csv.open()))
    found = {"req/s": float(row["Inferences/Second"]), "e2e_p50_ms": float(row["p50 latency"]) / 1000}
    if "Response Throughput" in row:
        found["chunks/s"] = float(row["Response Throughput"])
    return found


def pin(cpus: set[int]) -> None:
    os.sched_setaffinity(0, cpus)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="offline requests per run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=8, help="responses per streamed request")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each client (the best is kept)")
    parser.add_argument("--perf-analyzer", metavar="PATH", help="also measure with this perf_analyzer binary")
    args = parser.parse_args(argv)

    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpus = {cpus[0]}, set(cpus[1:]) or {cpus[0]}
    pin(server_cpus)  # the server and its python stubs inherit this
    with launch(MODELS, models=["echo", "echo_decoupled"]) as server:
        pin(client_cpu)
        print(f"client on CPU {sorted(client_cpu)}, tritonserver on CPU {sorted(server_cpus)}; {os.cpu_count()} CPUs")
        rows = []
        for model, requests in (("echo", args.requests), ("echo_decoupled", args.requests // args.chunks)):
            for concurrency in (args.concurrency, 1):
                count = requests if concurrency > 1 else requests // 10
                results: dict[str, list[dict[str, float]]] = {"bare": [], "perf": []}
                for _ in range(args.repeats):  # alternate, so drift hits both alike
                    results["bare"].append(
                        asyncio.run(measure_bare(server.grpc_url, model, concurrency, count, args.chunks))
                    )
                    results["perf"].append(
                        asyncio.run(measure_perf(server.grpc_url, model, concurrency, count, args.chunks))
                    )
                rows.append((model, concurrency, results))
        report(rows)
        for model in ("echo", "echo_decoupled") if args.perf_analyzer else ():
            try:
                figures = measure_perf_analyzer(
                    args.perf_analyzer, server.grpc_url, model, args.concurrency, args.chunks
                )
            except RuntimeError as exc:
                print(f"perf_analyzer {model}: {exc}")
                continue
            summary = ", ".join(f"{key} {value:,.3f}" for key, value in figures.items())
            print(f"perf_analyzer {model:<15} conc {args.concurrency}: {summary}")


def report(rows: list) -> None:
    rate = {"echo": "req/s", "echo_decoupled": "chunks/s"}
    header = (
        f"{'model':<15} {'conc':>4} {'client':<6} {'rate':>18} {'E2E p50':>9} {'server':>8}"
        f" {'added p50':>9} {'added mean':>10} {'CPU':>5} {'CPU/req':>9}"
    )
    print(header)
    print("-" * len(header))
    for model, concurrency, results in rows:
        unit = rate[model]
        best = {name: max(runs, key=lambda r: r[unit]) for name, runs in results.items()}
        for name in ("bare", "perf"):
            r = best[name]
            print(
                f"{model:<15} {concurrency:>4} {name:<6} {r[unit]:>9,.0f} {unit:<8} {r['e2e_p50_ms']:>7.3f}ms"
                f" {r['server_ms']:>6.3f}ms {r['e2e_p50_ms'] - r['server_ms']:>7.3f}ms"
                f" {r['e2e_mean_ms'] - r['server_ms']:>8.3f}ms {r['cpu']:>5.0%} {r['cpu_us']:>7.0f}us"
            )
        ratio = best["perf"][unit] / best["bare"][unit]
        print(f"{'':<15} {'':>4} perf/bare {ratio:.1%} (goal >= 90%)")
    print(
        "added = client-side E2E (p50, mean) - Triton's average request time (goal <= 0.5 ms);"
        " CPU = client core busy over the run; CPU/req = client CPU per request (1e6/it ~ the most one core drives)"
    )


if __name__ == "__main__":
    sys.exit(main())
