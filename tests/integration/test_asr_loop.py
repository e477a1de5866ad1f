"""The TTS -> ASR loop through the real command line: a tiny spark_tts deployment and a tiny whisper deployment built,
served side by side (each on its own ports), `perf --asr <whisper folder>` on the TTS one scoring its speech with the
whisper server's transcripts, then `stop <folder>` for one server and `stop --all` for the other.

Random weights: the transcripts are not meaningful, so the test checks that the scores are those of the whisper
server's own transcripts of the saved audio, not any value.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from trtdeploy.perf.asr import score, transcribe
from trtdeploy.perf.report import read_wav
from trtdeploy.perf.tts import resample
from trtdeploy.server import ephemeral_ports

from ..conftest import run_cli
from ..server.helpers import leftovers
from .speech import inputs_file

pytestmark = pytest.mark.server


def build(model: str, checkpoint: Path, root: Path, *options: str) -> Path:
    built = run_cli(
        "build", model, "--model-dir", str(checkpoint), "--gpu", "cpu", "--max-batch-size", "4", *options, "--json",
        cwd=root, timeout=900,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    return Path(json.loads(built.stdout)["deployment"])


def serve(folder: Path, state: dict[str, str]) -> dict:
    http, grpc, metrics = ephemeral_ports()
    started = run_cli(
        "serve", str(folder), "--background", "--http-port", str(http), "--grpc-port", str(grpc),
        "--metrics-port", str(metrics), "--json", env=state,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    return json.loads(started.stdout)


def ready(port: int) -> bool:
    """Whether a server answers /v2/health/ready on HTTP ``port``."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> dict[str, str]:
    return {"TRTDEPLOY_STATE_DIR": str(tmp_path_factory.mktemp("state"))}


def test_tts_scored_by_a_whisper_deployment_served_beside_it(trtdeploy_checkpoint, tmp_path, state, monkeypatch):
    from trtdeploy.server import current_server

    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", state["TRTDEPLOY_STATE_DIR"])
    tts = build("spark_tts", trtdeploy_checkpoint("spark_tts"), tmp_path, "--max-output-len", "200")
    whisper = build("whisper", trtdeploy_checkpoint("whisper"), tmp_path)
    servers = {}
    try:
        servers["tts"] = serve(tts, state)
        servers["whisper"] = serve(whisper, state)
        assert servers["tts"]["grpc_port"] != servers["whisper"]["grpc_port"]
        out = tmp_path / "perf"
        result = run_cli(
            "perf", str(tts), "--asr", str(whisper), "-c", "2", "--num-requests", "3", "--warmup", "0",
            "--input-data", str(inputs_file(tmp_path)), "--osl", "30", "--output-dir", str(out), "--no-plots", "--json",
            env=state, timeout=900,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        whisper_manifest = json.loads((whisper / "manifest.json").read_text())
        offline = "whisper_bls_offline" if whisper_manifest["point"]["mode"] == "streaming" else "whisper_bls"
        assert summary["family"] == "tts" and summary["asr"]["model"] == offline
        assert summary["asr"]["url"] == f"127.0.0.1:{servers['whisper']['grpc_port']}"
        level = summary["levels"][0]
        assert level["errors"] == 0 and level["asr"]["utterances"] == 3
        assert level["asr"]["languages"] == {"en": 2, "zh": 1}
        for key in ("wer_mean", "cer_mean", "wer_corpus", "cer_corpus"):
            assert level["asr"][key] is not None

        # the scores are those of the whisper server's own transcripts of the saved audio
        scored = [row for row in map(json.loads, (out / "requests.jsonl").read_text().splitlines()) if "scores" in row]
        assert len(scored) == 3
        wavs = []
        for row in scored:
            samples, rate = read_wav(out / row["audio_file"])
            wavs.append(resample(samples, rate, 16000))
        languages = ["zh" if "天" in row["reference"] else "en" for row in scored]
        url = f"127.0.0.1:{servers['whisper']['grpc_port']}"
        headers = current_server(url).restricted_headers("grpc")
        texts = asyncio.run(transcribe(url, wavs, languages, model=offline, headers=headers))
        assert [row["text"] for row in scored] == texts
        for row, text, language in zip(scored, texts, languages, strict=True):
            expected = score(text, row["reference"], language)
            assert row["scores"] == {"wer": expected.wer, "cer": expected.cer}

        # one server stopped by its folder; the other keeps serving until `stop --all`
        stopped = run_cli("stop", str(tts), "--json", env=state)
        assert stopped.returncode == 0, stopped.stderr
        assert [s["pid"] for s in json.loads(stopped.stdout)["stopped"]] == [servers["tts"]["pid"]]
        assert ready(servers["whisper"]["http_port"]) and not ready(servers["tts"]["http_port"])
        not_tts = run_cli("perf", str(whisper), "--asr", str(whisper), "--num-requests", "1", env=state)
        assert not_tts.returncode == 2 and "--asr/--asr-url scores speech" in not_tts.stderr
        everything = run_cli("stop", "--all", "--json", env=state)
        assert everything.returncode == 0, everything.stderr
        assert [s["pid"] for s in json.loads(everything.stdout)["stopped"]] == [servers["whisper"]["pid"]]
        assert not ready(servers["whisper"]["http_port"])
        refused = run_cli("perf", str(tts), "--asr", str(whisper), env=state)
        assert refused.returncode == 5
        assert f"no running server serves the whisper deployment {whisper}" in refused.stderr
        assert f"trtdeploy serve {whisper} --background --grpc-port" in " ".join(refused.stderr.split())
    finally:
        run_cli("stop", "--all", env=state)
    for info in servers.values():
        assert leftovers(pgid=info["pgid"]) == []
