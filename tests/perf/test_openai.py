"""``perf --endpoint openai`` against a real OpenAI-compatible server on the CPU: ``transformers serve`` on the tiny
random Qwen2 checkpoint, beside the Triton deployment of the same checkpoint (torch engine). The same workload (seed,
synthetic prompts, output length, greedy decoding) gives both the same prompts, token counts and texts, and TTFT and
ITL where the answers stream."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from trtdeploy.errors import UsageError
from trtdeploy.perf.openai_api import base_url, error_message, read_events
from trtdeploy.perf.records import Record
from trtdeploy.server import ephemeral_ports

from ..conftest import run_cli
from ..server.helpers import wait_until

pytestmark = pytest.mark.server

ISL, OSL = 16, 12
#: One workload for both servers: 2 slots, 6 measured requests, synthetic prompts of ISL tokens, exactly OSL out.
WORKLOAD = ("-c", "2", "--num-requests", "6", "--isl", str(ISL), "--osl", str(OSL), "--seed", "3", "--no-plots")
#: transformers serve takes no ignore_eos: its own field generates exactly OSL tokens (min_new_tokens = max_tokens).
EXACT_LENGTH = json.dumps({"generation_config": json.dumps({"min_new_tokens": OSL})})


def models_of(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as answer:
        return json.loads(answer.read())["data"]


def listing(url: str) -> bool:
    try:
        return bool(models_of(url))
    except OSError:
        return False


@pytest.fixture(scope="module")
def openai_server(qwen_checkpoint, tmp_path_factory):
    """``transformers serve`` on the checkpoint, on a free local port; its base URL (stopped after the module)."""
    (port,) = ephemeral_ports(1)
    log = tmp_path_factory.mktemp("transformers-serve") / "serve.log"
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(qwen_checkpoint)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    with log.open("w") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        ready = wait_until(lambda: server.poll() is not None or listing(url), timeout=120, interval=0.5)
        assert ready and server.poll() is None, f"transformers serve did not start:\n{log.read_text()[-3000:]}"
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def triton(trtdeploy_deploy, trtdeploy_serve):
    """The streaming qwen_llm deployment of the same checkpoint, served by the real tritonserver."""
    deployment = trtdeploy_deploy("qwen_llm", mode="streaming", max_input_len=64, max_output_len=32)
    return deployment, trtdeploy_serve(deployment)


def perf(tmp_path: Path, name: str, *args: str) -> tuple[dict, list[dict]]:
    """``trtdeploy perf ARGS``: its summary (as printed and written) and its measured records."""
    out = tmp_path / name
    done = run_cli("perf", *args, "--output-dir", str(out), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary == json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return summary, [record for record in records if not record["warmup"]]


def openai_perf(tmp_path: Path, name: str, url: str, checkpoint: Path, *args: str) -> tuple[dict, list[dict]]:
    return perf(tmp_path, name, "--endpoint", "openai", "--url", url, "--tokenizer", str(checkpoint), *args)


def check_streamed(records: list[dict]) -> None:
    """Streamed answers of exactly OSL tokens (the server's count) to prompts of ISL tokens, with TTFT and ITL."""
    assert len(records) == 6 and all(record["error"] is None for record in records)
    for record in records:
        assert (record["input_tokens"], record["output_tokens"], record["token_source"]) == (ISL, OSL, "server")
        assert 0 < record["ttft_ms"] < record["e2e_ms"]
        first = record["first_chunk_tokens"]
        assert 1 <= first < OSL and len(record["chunk_ms"]) > 1
        assert record["itl_ms"] == pytest.approx((record["e2e_ms"] - record["ttft_ms"]) / (OSL - first))


def test_the_same_workload_on_triton_and_on_an_openai_server(triton, openai_server, qwen_checkpoint, tmp_path):
    deployment, server = triton
    triton_summary, on_triton = perf(
        tmp_path, "triton", str(deployment.path), "--url", server.grpc_url, *WORKLOAD, "--ignore-eos"
    )
    summary, on_openai = openai_perf(
        tmp_path, "openai", openai_server, qwen_checkpoint, *WORKLOAD, "--extra-body", EXACT_LENGTH
    )
    check_streamed(on_triton)
    check_streamed(on_openai)
    by_row = {record["row"]: record["text"] for record in on_triton}
    assert {record["row"]: record["text"] for record in on_openai} == by_row  # same prompts, same greedy answers
    assert len(set(by_row.values())) > 1  # and the prompts differ

    (model,) = models_of(openai_server)
    assert (summary["endpoint"], summary["protocol"], summary["api"]) == ("openai", "openai", "completions")
    assert (summary["model"], summary["served_by"]) == (model["id"], model["owned_by"])
    assert summary["deployment"] is None and summary["build"] is None and triton_summary["endpoint"] == "triton"
    level = summary["levels"][0]
    assert level["token_source"] == "server" and level["errors"] == 0
    assert level["output_token_throughput"] > 0 and level["input_token_throughput"] > 0

    report = run_cli("report", "triton", "openai", "--no-plots", "--json", "--output-dir", "both", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    labels = [run["label"] for run in json.loads(report.stdout)["runs"]]
    assert labels == ["qwen_llm torch fp32 cpu", f"{model['id']} openai {model['owned_by']}"]


def test_whole_answers_and_chat(openai_server, qwen_checkpoint, tmp_path):
    extra = ("--extra-body", EXACT_LENGTH)
    _, whole = openai_perf(tmp_path, "whole", openai_server, qwen_checkpoint, *WORKLOAD, *extra, "--no-stream")
    assert all(record["error"] is None and record["output_tokens"] == OSL for record in whole)
    assert all(record["input_tokens"] == ISL and record["first_chunk_tokens"] == OSL for record in whole)
    assert all(record["ttft_ms"] is None and record["itl_ms"] is None for record in whole)
    assert all(len(record["chunk_ms"]) == 1 for record in whole)

    chat_isl = ISL + 24  # the chat template's tokens are part of the prompt's length
    args = (*WORKLOAD, "--isl", str(chat_isl), *extra, "--api", "chat")
    summary, chat = openai_perf(tmp_path, "chat", openai_server, qwen_checkpoint, *args)
    assert summary["api"] == "chat" and summary["stream"] is True
    assert all(record["error"] is None and record["output_tokens"] == OSL for record in chat)
    assert all(record["input_tokens"] == chat_isl for record in chat)  # the server's count, the template included
    assert all(0 < record["ttft_ms"] <= record["e2e_ms"] for record in chat)


def test_a_request_the_server_fails_is_a_failed_request(openai_server, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"input": "the quick brown fox"}\n{"input": ""}\n{"input": "hello world"}\n')
    for mode in ("--stream", "--no-stream"):
        args = ("--input-data", str(rows), "--num-requests", "3", "--osl", "4", "--warmup", "0", "--no-plots", mode)
        out = tmp_path / mode
        done = run_cli("perf", "--endpoint", "openai", "--url", openai_server, *args, "--output-dir", str(out))
        assert done.returncode == 6 and "1 of 3 requests failed" in done.stderr  # an empty prompt fails there
        records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
        failed = [record for record in records if record["error"] is not None]
        assert [record["row"] for record in failed] == [1]
        assert mode == "--stream" or failed[0]["error"].startswith("HTTP 500: ")
        # the others: counted by the server's usage, without a tokenizer
        assert all(
            record["output_tokens"] == 4 and record["input_tokens"] > 0 for record in records if not record["error"]
        )


def test_refusals_name_the_problem(openai_server, qwen_checkpoint, tmp_path):
    base = ("perf", "--endpoint", "openai", "--url", openai_server, "--isl", "8", "--osl", "2", "--no-plots")
    out = tmp_path / "refused"
    refused = run_cli(*base, "--tokenizer", str(qwen_checkpoint), "--ignore-eos", "--output-dir", str(out))
    assert refused.returncode == 2 and "refused a request" in refused.stderr and "ignore_eos" in refused.stderr
    assert not out.exists()  # refused before the load: nothing written
    untokenized = run_cli(*base)
    assert untokenized.returncode == 2 and "--tokenizer" in untokenized.stderr
    unknown = run_cli(*base, "--tokenizer", str(qwen_checkpoint), "--model", "no-such-model")
    assert unknown.returncode == 3 and "no-such-model" in unknown.stderr
    assert models_of(openai_server)[0]["id"] in unknown.stderr
    (closed,) = ephemeral_ports(1)
    unreachable = run_cli(*base[:4], f"127.0.0.1:{closed}", *base[5:], "--tokenizer", str(qwen_checkpoint))
    assert unreachable.returncode == 5 and f"127.0.0.1:{closed}" in unreachable.stderr
    for args, named in (
        (("--api", "chat"), "--endpoint openai"),
        (("--endpoint", "openai"), "--url"),
        (("--endpoint", "openai", "--url", openai_server, "--protocol", "http"), "--protocol"),
        (("--endpoint", "openai", "--url", openai_server, "--extra-body", "[1]"), "--extra-body"),
    ):
        done = run_cli("perf", *args, cwd=tmp_path)
        assert done.returncode == 2 and named in done.stderr and done.stderr.count("Error:") == 1, done.stderr


def test_urls():
    assert base_url("localhost:8000") == "http://localhost:8000"
    assert base_url("http://10.0.0.1:8000/v1/") == "http://10.0.0.1:8000"
    assert base_url("https://example.com/serving/v1") == "https://example.com/serving"
    for bad in ("localhost:x", "ftp://host:1", "http://host:1/v1?key=1", "host:0"):
        with pytest.raises(UsageError, match="--url"):
            base_url(bad)


def test_error_messages():
    assert error_message(b'{"error": {"message": "max_tokens is too large", "code": 400}}') == "max_tokens is too large"
    assert error_message(b'{"object": "error", "message": "no such model"}') == "no such model"
    assert error_message(b'{"detail": "Unexpected fields"}') == "Unexpected fields"
    assert error_message(b"Internal Server Error\n") == "Internal Server Error"
    assert error_message(b"") == "no message"


def read(*parts: bytes) -> Record:
    """A record of the events that ``read_events`` reads from a body arriving in ``parts``."""

    async def blocks():
        for part in parts:
            yield part

    rec = Record(0, 0, False)
    asyncio.run(read_events(blocks(), rec))
    return rec


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_server_sent_events_split_anywhere(newline):
    events = [b'{"choices": [{"text": "a"}]}', b'{"choices": [{"text": "b"}]}', b'{"usage": {"completion_tokens": 2}}']
    body = newline.join([b": a comment", b"event: completion", *(b"data: " + e + newline for e in events)])
    body += newline + b"data: [DONE]" + newline * 2 + b"data: after the end" + newline * 2
    for size in (1, 7, len(body)):
        rec = read(*(body[i : i + size] for i in range(0, len(body), size)))
        assert (rec.raw, rec.error) == (events, None)
        assert len(rec.chunk_ns) == 3 and rec.chunk_ns == sorted(rec.chunk_ns) and rec.end_ns >= rec.chunk_ns[-1]


def test_a_stream_without_done_or_a_last_blank_line_and_an_error_event():
    rec = read(b'data: {"choices": []}\n\ndata: {"usage": {}}')
    assert rec.raw == [b'{"choices": []}', b'{"usage": {}}'] and rec.end_ns == 0  # the transport ends it
    rec = read(b'data: {"choices": []}\n\ndata: {"error": {"message": "out of memory"}}\n\n', b"data: [DONE]\n\n")
    assert rec.error == "out of memory" and len(rec.raw) == 1
