"""The main job end to end on one model: checkpoint → build → serve → perf → stop.

Where the Hub cannot be reached, every stage runs on a random-weight checkpoint in the same layout, and the
result says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import build
from .deployment import Deployment
from .download import download, write_random
from .errors import NetworkError
from .plugins import get_model


@dataclass(frozen=True)
class QuickstartSettings:
    model: str = "qwen_llm"
    root: Path = Path("quickstart")
    gpu: str | None = None
    concurrency: Sequence[int] = (1, 2, 4)
    input_tokens: int = 64
    output_tokens: int = 32


@dataclass
class QuickstartResult:
    deployment: Deployment
    random_weights: bool
    perf: object  # trtdeploy.perf.runner.PerfRun


def run(settings: QuickstartSettings, *, say: Callable[[str], None], progress: object = None) -> QuickstartResult:
    """Run every stage; ``say`` gets one line per stage (and the one line about random weights, if it comes to that)."""
    from .benchmark import PerfSettings, benchmark
    from .perf.runner import InputSpec, LoadSettings
    from .perf.workload import RequestOptions
    from .server import serve_deployment, stop_signals_as_interrupt

    spec = get_model(settings.model)
    root = settings.root.resolve()
    say(f"1/4 checkpoint: {spec.default_repo}")
    try:
        checkpoint = download(spec.default_repo).path
        random_weights = False
    except NetworkError:
        say("    the Hub is unreachable: every stage runs on random weights in the same layout (outputs are noise)")
        checkpoint = root / "checkpoints" / f"{spec.name}-random-weights"
        if not checkpoint.is_dir():  # written once, then reused
            write_random(spec, checkpoint)
        random_weights = True
    say("2/4 build: torch engine, streaming")
    built = build.run(
        build.BuildRequest(
            model=spec.name,
            gpu=settings.gpu,
            model_dir=checkpoint,
            output_root=root / "deployments",
            max_batch_size=max(settings.concurrency),
            max_input_len=max(512, settings.input_tokens),
            max_output_len=max(256, settings.output_tokens),
        )
    ).deployment
    say(f"3/4 serve: {built.path}")
    # recorded like any served deployment (`trtdeploy stop` finds it); SIGTERM stops it as Ctrl-C does
    with stop_signals_as_interrupt(), serve_deployment(built)[0] as server:
        say(f"4/4 perf: concurrency {','.join(map(str, settings.concurrency))} against {server.grpc_url}")
        perf = benchmark(
            PerfSettings(
                deployment=built.path,
                url=server.grpc_url,
                metrics_url=server.metrics_url,
                load=LoadSettings(concurrency=tuple(settings.concurrency)),
                inputs=InputSpec(isl=settings.input_tokens, osl=settings.output_tokens),
                options=RequestOptions(ignore_eos=True),
                output_dir=root / "perf-results" / ("random-weights" if random_weights else "hub-weights"),
            ),
            progress=progress,
        )
    return QuickstartResult(deployment=built, random_weights=random_weights, perf=perf)
