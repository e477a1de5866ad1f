"""``--timeline`` of the serving benches: the server traces every request (Triton's trace, which the entry models
pass on to the models they call), and each level is then shown as where its requests' time went, medians per
request: the first response, and per model called its calls, time, queueing and time before the first response;
``rest`` is the entry's own work and its waits on the LLM (whose trace ends when its decode loop takes the request).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtdeploy.deployment import Deployment
from trtdeploy.perf.timeline import read_traces, summarize, timelines
from trtdeploy.server import launch


def trace_arguments(trace_file: Path) -> tuple[str, ...]:
    """tritonserver's arguments tracing every request's timestamps: each request with its calls into a file of its own
    as it ends (``trace_file``.0, .1, ...), so that none is lost when the server is stopped hard."""
    trace_file.parent.mkdir(parents=True, exist_ok=True)
    settings = (
        "mode=triton",
        f"triton,file={trace_file}",
        "triton,log-frequency=1",
        "level=TIMESTAMPS",
        "rate=1",
        "count=-1",
    )
    return tuple(part for setting in settings for part in ("--trace-config", setting))


def serve(deployment: Deployment, log_file: Path, *, timeline: bool, **kwargs: Any) -> tuple[Any, Path]:
    """``launch`` for the deployment (a context manager), tracing its requests when ``timeline``; and the trace file,
    in a folder beside ``log_file``."""
    trace_file = log_file.parent / f"{log_file.stem}-trace" / "trace.json"
    extra = trace_arguments(trace_file) if timeline else ()
    server = launch(deployment.model_repo, models=deployment.models, log_file=log_file, extra_args=extra, **kwargs)
    return server, trace_file


def add_timelines(trace_file: Path, windows: list[tuple[dict, str, int, int]]) -> None:
    """Give each level of ``windows`` (the level, its entry model, its start and end on ``time.monotonic_ns``, which
    is Triton's clock) the medians of its requests to the entry (its warm-up requests run in its window too)."""
    found = timelines(read_traces(sorted(trace_file.parent.glob(trace_file.name + "*"))))
    for level, entry, start, end in windows:
        level["timeline"] = summarize([t for t in found if t.model == entry and start <= t.start <= end])


def print_timelines(rows: list[tuple[str, dict]]) -> None:
    """One line per level of ``(mode, level)`` rows whose level has a ``timeline``."""
    print("where the time went (medians per request, ms; per model: calls, time, of it queued, before 1st response)")
    for mode, level in rows:
        timeline: dict[str, Any] = level["timeline"]
        if not timeline["requests"]:
            continue
        parts = [
            f"{name} {m['calls']:g}x {m['ms']:.1f} (q {m['queue_ms']:.1f}, 1st {m['before_first_ms']:.1f})"
            for name, m in timeline["models"].items()
        ]
        print(
            f"  {mode:<10} {level['concurrency']:>4}: latency {timeline['latency_ms']:.1f}, 1st response "
            f"{timeline['first_response_ms']:.1f} | " + " | ".join(parts) + f" | rest {timeline['rest_ms']:.1f} "
            f"(1st {timeline['rest_before_first_ms']:.1f})",
            flush=True,
        )
