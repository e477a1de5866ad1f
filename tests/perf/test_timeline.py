"""Timelines from Triton's trace: hand-made trace entries, and a real server whose BLS model passes its trace on."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from trtdeploy.perf.timeline import read_traces, summarize, timelines


def _trace(trace_id, model, marks, parent=None):
    head = {"id": trace_id, "model_name": model, "model_version": 1}
    if parent is not None:
        head["parent_id"] = parent
    return [head] + [{"id": trace_id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in marks.items()]


def _call(start, queued, end):
    return {"REQUEST_START": start, "QUEUE_START": start, "COMPUTE_START": start + queued, "REQUEST_END": end}


MS = 1_000_000
#: A stream: its tokenizer ensemble (one step inside), an LLM call, then token2wav; first chunk sent at 60 ms.
ENTRIES = [
    *_trace(1, "tts", {"REQUEST_START": 0, "GRPC_SEND_START": 60 * MS, "REQUEST_END": 100 * MS}),
    *_trace(2, "reference_voice", {"REQUEST_START": 2 * MS, "REQUEST_END": 12 * MS}, parent=1),
    *_trace(3, "audio_tokenizer", _call(3 * MS, 1 * MS, 11 * MS), parent=2),
    *_trace(4, "tensorrt_llm", _call(15 * MS, 0, 16 * MS), parent=1),
    *_trace(5, "token2wav", _call(40 * MS, 5 * MS, 58 * MS), parent=1),
    *_trace(6, "token2wav", _call(70 * MS, 0, 90 * MS), parent=1),
]


def test_a_request_timeline_names_its_calls_their_queueing_and_the_time_before_its_first_response():
    (timeline,) = timelines(ENTRIES)
    assert (timeline.model, timeline.first_response, timeline.end) == ("tts", 60 * MS, 100 * MS)
    assert [(call.model, call.depth) for call in timeline.calls] == [
        ("reference_voice", 1),
        ("audio_tokenizer", 2),
        ("tensorrt_llm", 1),
        ("token2wav", 1),
        ("token2wav", 1),
    ]
    # the direct calls cover 10 + 1 + 18 + 20 ms of the 100
    assert timeline.rest_ns() == 51 * MS and timeline.rest_ns(60 * MS) == 31 * MS
    summary = summarize([timeline])
    assert summary["first_response_ms"] == 60 and summary["latency_ms"] == 100 and summary["rest_ms"] == 51
    assert summary["models"]["token2wav"] == {"calls": 2, "ms": 38, "queue_ms": 5, "before_first_ms": 18}
    assert "audio_tokenizer" not in summary["models"]  # the ensemble's step is inside reference_voice


def test_medians_count_requests_without_a_call_and_a_cut_file_is_read_to_its_last_entry(tmp_path):
    second = [
        *_trace(10, "tts", {"REQUEST_START": 200 * MS, "REQUEST_END": 240 * MS}),  # offline: no send mark
        *_trace(11, "token2wav", _call(210 * MS, 0, 230 * MS), parent=10),
    ]
    path = tmp_path / "trace.json"
    text = json.dumps(ENTRIES + second)
    path.write_text(text[: text.rfind("}]") + 1])  # Triton stopped mid-entry, just after an inner object
    (tmp_path / "started.json").write_text("[")
    found = timelines(read_traces([path, tmp_path / "started.json"]))
    assert [t.first_response for t in found] == [60 * MS, 240 * MS]  # the offline one answers at its end
    summary = summarize(found)
    assert summary["requests"] == 2
    assert summary["models"]["reference_voice"]["calls"] == 0.5  # one of the two requests made it
    assert summarize([]) == {"requests": 0, "models": {}}


CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy import call_model


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            for _ in range(2):
                call_model("worker", [x], ["Y"], request.trace())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones(1, np.float32))]))
        return responses
"""
WORKER = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.02)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones(1, np.float32))]) for _ in requests]
"""
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


@pytest.mark.server
def test_a_bls_call_carries_its_callers_trace_into_the_timeline(tmp_path):
    tritonclient = pytest.importorskip("tritonclient.grpc")
    from trtdeploy.server import launch

    repo = tmp_path / "repo"
    for name, code in (("caller", CALLER), ("worker", WORKER)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(name=name)))
        (repo / name / "1" / "model.py").write_text(code)
    trace = tmp_path / "trace.json"
    settings = ("mode=triton", f"triton,file={trace}", "level=TIMESTAMPS", "rate=1", "count=-1")
    arguments = [part for setting in settings for part in ("--trace-config", setting)]
    start = time.monotonic_ns()
    with launch(repo, models=["worker", "caller"], log_file=tmp_path / "log", extra_args=arguments) as server:
        client = tritonclient.InferenceServerClient(server.grpc_url.split("://")[-1])
        tensor = tritonclient.InferInput("X", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, np.float32))
        for _ in range(2):
            client.infer("caller", [tensor])
    found = timelines(read_traces([Path(trace)]))
    assert [t.model for t in found] == ["caller", "caller"]
    assert all(start <= t.start <= time.monotonic_ns() for t in found)  # the steady clock time.monotonic_ns reads
    assert all([(c.model, c.depth) for c in t.calls] == [("worker", 1)] * 2 for t in found)
    worker = summarize(found)["models"]["worker"]
    assert worker["calls"] == 2 and worker["ms"] >= 40
