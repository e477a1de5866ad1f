"""``trtdeploy perf``: the load generator, its metrics and reports.

Model plugins use the workload API (:mod:`trtdeploy.perf.workload`, re-exported here) and, for text LLMs, the
ready-made :class:`TextLLMWorkload` / :class:`TokenLLMWorkload`. :func:`trtdeploy.perf.runner.benchmark` runs the
whole command; :func:`trtdeploy.perf.runner.run_levels` loads a server with any workload.
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
