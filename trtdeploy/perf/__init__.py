"""The perf engine: load generator, transports, metrics, records and reports, for any Triton endpoint.

Model plugins use the workload API (:mod:`trtdeploy.perf.workload`, re-exported here) and, for text LLMs, the
ready-made :class:`TextLLMWorkload` / :class:`TokenLLMWorkload`. :func:`trtdeploy.perf.runner.run_levels` loads an
endpoint with any workload; :func:`trtdeploy.benchmark.benchmark` is the whole ``trtdeploy perf`` command (finding
the server and deployment is not this package's business).
"""

from .llm import TextLLMWorkload, TokenLLMWorkload
from .workload import (
    Chunk,
    InputRow,
    MetricFamily,
    ModelInfo,
    Request,
    RequestOptions,
    Result,
    TensorSpec,
    TokenSource,
    Workload,
)

__all__ = [
    "Chunk",
    "InputRow",
    "MetricFamily",
    "ModelInfo",
    "Request",
    "RequestOptions",
    "Result",
    "TensorSpec",
    "TextLLMWorkload",
    "TokenLLMWorkload",
    "TokenSource",
    "Workload",
]
