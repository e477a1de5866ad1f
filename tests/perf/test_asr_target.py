"""``perf --asr DEPLOYMENT_OR_URL``: which Whisper server and model a TTS run is scored with, and the errors when
there is none; and ``perf`` on a whisper deployment (the ASR workload through the command line), against the fake
whisper_bls on the real server."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from trtdeploy.benchmark import PerfSettings, benchmark, resolve_asr
from trtdeploy.deployment import Deployment
from trtdeploy.errors import NotFoundError, ServerError, UsageError
from trtdeploy.hookspecs import hookimpl
from trtdeploy.perf.asr_workload import ASRWorkload
from trtdeploy.perf.report import write_wav
from trtdeploy.perf.runner import LoadSettings
from trtdeploy.perf.tts import TTSWorkload
from trtdeploy.plugins import forget_registrations, pm

from ..manifests import write_manifest
from .conftest import FakeModelSpec, write_fake_whisper


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def whisper_deployment(root: Path, mode: str = "offline", model: str = "perf_fake_whisper") -> Path:
    """A deployment folder whose repository holds the fake whisper_bls (streaming: decoupled, and
    whisper_bls_offline beside it)."""
    path = root / model / f"torch-fp32-bs8-tp1pp1-{mode}"
    models = ["whisper_bls", "whisper_bls_offline"] if mode == "streaming" else ["whisper_bls"]
    write_fake_whisper(path / "model_repo" / "whisper_bls", decoupled=mode == "streaming")
    if mode == "streaming":
        write_fake_whisper(path / "model_repo" / "whisper_bls_offline")
    return write_manifest(path, models=models, entry_model="whisper_bls", model=model, mode=mode)


class _FakeWhisper(FakeModelSpec):
    """A model plugin whose workload is the ASR workload (on the fake whisper_bls)."""

    name = "perf_fake_whisper"

    def entry_model(self, mode):
        return "whisper_bls"

    def workload(self, deployment):
        return ASRWorkload(deployment.entry_model, deployment.decoupled)


class _FakeTTS(_FakeWhisper):
    """A model plugin whose workload is a TTS workload (no such model is served: the runs stop before the load)."""

    name = "perf_fake_tts"

    def entry_model(self, mode):
        return "fake_tts"

    def workload(self, deployment):
        return TTSWorkload("fake_tts", decoupled=False, sample_rate=16000, tokens_per_second=50)


class _FakePlugin:
    @hookimpl
    def register_models(self, register):
        register(_FakeWhisper())
        register(_FakeTTS())


@pytest.fixture
def speech_plugins():
    pm.register(_FakePlugin(), name="perf-fake-speech")
    forget_registrations()
    yield
    pm.unregister(name="perf-fake-speech")
    forget_registrations()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


# --- resolving --asr ----------------------------------------------------------------------------------------------


def test_host_and_port_is_taken_as_given():
    assert resolve_asr("localhost:8001").url == "localhost:8001"
    assert resolve_asr("localhost:8001").model == "whisper_bls"
    settings = resolve_asr("grpc://127.0.0.1:9001", model="whisper", language="zh")
    assert (settings.model, settings.language, dict(settings.headers)) == ("whisper", "zh", {})


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nowhere", "--asr nowhere: no such folder, and not HOST:PORT"),
        ("localhost:99999", "port 99999 is not between 1 and 65535"),
        ("http://localhost:8000", "is not HOST:PORT"),
    ],
)
def test_neither_a_folder_nor_host_and_port(target, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=message):
        resolve_asr(target)


def test_folders_that_are_not_whisper_deployments(tmp_path, make_deployment):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(UsageError, match="file.txt: not a folder"):
        resolve_asr(str(tmp_path / "file.txt"))
    with pytest.raises(NotFoundError, match=f"--asr {tmp_path}: {tmp_path} is not a deployment folder"):
        resolve_asr(str(tmp_path))
    tts = make_deployment(model="spark_tts", models=["text_llm"], entry_model="text_llm")
    with pytest.raises(UsageError, match=r"is a spark_tts deployment, not a whisper one \(it has no whisper_bls"):
        resolve_asr(str(tts))


def test_a_whisper_deployment_without_a_server(tmp_path, state):
    folder = whisper_deployment(tmp_path)
    with pytest.raises(ServerError, match="no running server serves the whisper deployment") as caught:
        resolve_asr(str(folder))
    assert f"trtdeploy serve {folder.resolve()} --background --grpc-port" in caught.value.hint


@pytest.mark.server
@pytest.mark.parametrize(("mode", "model"), [("offline", "whisper_bls"), ("streaming", "whisper_bls_offline")])
def test_a_served_whisper_deployment_gives_its_server_and_offline_model(tmp_path, state, mode, model):
    from trtdeploy.server import serve_deployment

    deployment = Deployment.load(whisper_deployment(tmp_path, mode))
    server, info = serve_deployment(deployment, background=True)
    with server:
        settings = resolve_asr(str(deployment.path))
        assert (settings.url, settings.model) == (server.grpc_url, model)
        assert dict(settings.headers) == info.restricted_headers("grpc") != {}
        assert resolve_asr(str(deployment.path), model="whisper_bls").model == "whisper_bls"


@pytest.mark.server
def test_an_unreachable_asr_server_stops_the_run_before_the_load(fake_server, speech_plugins, tmp_path):
    """A closed local port: the run fails naming it, before any TTS request (the TTS model need not exist)."""
    port = closed_port()
    tts = write_manifest(tmp_path / "tts", models=["fake_tts"], entry_model="fake_tts", model="perf_fake_tts")
    settings = PerfSettings(
        deployment=tts,
        url=fake_server.grpc_url,
        load=LoadSettings(num_requests=1, warmup=0),
        output_dir=tmp_path / "out",
        asr=resolve_asr(f"127.0.0.1:{port}"),
    )
    with pytest.raises(ServerError, match=f"cannot reach the Whisper server at 127.0.0.1:{port}") as caught:
        benchmark(settings)
    assert "--asr" in caught.value.hint
    assert not (tmp_path / "out").exists()


# --- perf on a whisper deployment -----------------------------------------------------------------------------


@pytest.mark.server
def test_cli_perf_on_a_whisper_deployment_writes_asr_reports(speech_plugins, tmp_path, state, capsys):
    from trtdeploy.cli.main import main
    from trtdeploy.server import serve_deployment

    lines = []
    for index, (text, first) in enumerate([("EN 1600 1600 0.25", 0.25), ("en 1600 1600 0.75", 0.5)]):
        write_wav(tmp_path / f"{index}.wav", [first] + [0.01] * 1599, 16000)
        lines.append({"audio": f"{index}.wav", "text": text})
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    deployment = Deployment.load(whisper_deployment(tmp_path, "streaming"))
    out = tmp_path / "out"
    server, _ = serve_deployment(deployment, background=True)
    with server:
        args = ["perf", str(deployment.path), "--input-data", str(tmp_path / "in.jsonl"), "-c", "1,2"]
        with pytest.raises(SystemExit) as caught:
            main([*args, "--num-requests", "2", "--output-dir", str(out), "--no-plots"])
    captured = capsys.readouterr()
    assert caught.value.code == 0, captured.err
    assert "whisper_bls (streaming, grpc)" in captured.out and "1st partial p50/p99" in captured.out
    assert "WER/CER: corpus rates, Whisper's normalisers" in " ".join(captured.out.split())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["family"] == "asr" and summary["workload"] == "ASRWorkload"
    for level in summary["levels"]:
        assert level["asr"]["wer_corpus"] == pytest.approx(1 / 8) and level["first_partial_ms"]["count"] == 2
    csv_header = (out / "summary.csv").read_text().splitlines()[0].split(",")
    assert {"asr_wer_corpus", "asr_wer_mean", "rtf_aggregate", "audio_seconds_per_second"} <= set(csv_header)
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    measured = [row for row in rows if not row["warmup"]]
    assert len(measured) == 4 and all(row["error"] is None for row in rows)
    wrong = [row for row in measured if row["asr"]["errors"]]
    assert len(wrong) == 2 and all(row["text"] == "en 1600 1600 0.5" for row in wrong)
    assert wrong[0]["asr"]["language"] == "en" and wrong[0]["asr"]["substitutions"] == 1
    assert (wrong[0]["asr"]["hypothesis_normalized"], wrong[0]["asr"]["reference_normalized"]) == (
        "en 1600 1600 0.5",
        "en 1600 1600 0.75",
    )
    assert all(row["audio_seconds"] == 0.1 and row["rtf"] > 0 for row in measured)
