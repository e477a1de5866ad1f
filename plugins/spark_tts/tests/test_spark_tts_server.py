"""Spark-TTS on the real tritonserver: a tiny random checkpoint in the official layout, torch engine, CPU.

The random LLM speaks only semantic tokens and never ends on its own (see ``checkpoint.py``), so a request with
``max_tokens`` N comes back with exactly N * 320 samples.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from trtdeploy_spark_tts.checkpoint import write_random_checkpoint
from trtdeploy_spark_tts.prompt import SAMPLE_RATE, SAMPLES_PER_TOKEN

from trtdeploy.build import BuildRequest, run

pytestmark = pytest.mark.server

#: Small chunks, so that a few hundred tokens stream as several chunks.
STREAM_OPTIONS = {"chunk_seconds": "0.4", "chunk_growth": "2", "max_chunk_seconds": "4"}


def voice(seconds: float, seed: int = 0) -> np.ndarray:
    from trtdeploy.perf.tts import synthetic_voice

    return synthetic_voice(seconds, np.random.default_rng(seed), SAMPLE_RATE)


def tts_inputs(
    wav: np.ndarray | None,
    target: bytes | None = b"Hello from the test suite.",
    reference: bytes | None = b"A short reference sentence.",
    **scalars: tuple[object, str],
) -> list[grpcclient.InferInput]:
    def tensor(name: str, array: np.ndarray, dtype: str) -> grpcclient.InferInput:
        item = grpcclient.InferInput(name, list(array.shape), dtype)
        item.set_data_from_numpy(array)
        return item

    inputs = []
    if wav is not None:
        inputs.append(tensor("reference_wav", wav.reshape(1, -1).astype(np.float32), "FP32"))
        inputs.append(tensor("reference_wav_len", np.array([[wav.size]], dtype=np.int32), "INT32"))
    for name, value in (("reference_text", reference), ("target_text", target)):
        if value is not None:
            inputs.append(tensor(name, np.array([[value]], dtype=object), "BYTES"))
    numpy_types = {"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64}
    for name, (value, dtype) in scalars.items():
        inputs.append(tensor(name, np.array([[value]], dtype=numpy_types[dtype]), dtype))
    return inputs


def offline(url: str, model: str, inputs: list[grpcclient.InferInput]) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.infer(model, inputs).as_numpy("waveform").reshape(-1)
    finally:
        client.close()


def streamed(url: str, inputs: list[grpcclient.InferInput], model: str = "spark_tts") -> list[np.ndarray]:
    """Every audio chunk of one streamed request; InferenceServerException if the stream answers an error."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        chunks = []
        while True:
            result, error = answers.get(timeout=120)
            if error is not None:
                raise error
            if result.get_response().parameters["triton_final_response"].bool_param:
                return chunks
            chunks.append(result.as_numpy("waveform").reshape(-1))
    finally:
        client.stop_stream()
        client.close()


def ask(url: str, model: str, inputs: list[grpcclient.InferInput]) -> np.ndarray:
    """The whole audio of one request: streamed from ``spark_tts``, in one piece from ``spark_tts_offline``."""
    if model == "spark_tts":
        return np.concatenate(streamed(url, inputs, model))
    return offline(url, model, inputs)


@pytest.fixture(scope="module")
def server(trtdeploy_deploy, trtdeploy_serve):
    deployment = trtdeploy_deploy(
        "spark_tts", mode="streaming", max_input_len=1024, max_output_len=400, options=STREAM_OPTIONS
    )
    return trtdeploy_serve(deployment)


def test_offline_audio_has_the_length_the_tokens_imply(server):
    audio = offline(server.grpc_url, "spark_tts_offline", tts_inputs(voice(2.0), max_tokens=(30, "INT32")))
    assert audio.dtype == np.float32 and audio.size == 30 * SAMPLES_PER_TOKEN
    assert np.isfinite(audio).all() and audio.std() > 0


def test_stream_sends_chunks_whose_concatenation_is_the_offline_audio(server):
    request = {"max_tokens": (300, "INT32"), "random_seed": (11, "UINT64")}
    chunks = streamed(server.grpc_url, tts_inputs(voice(3.0, seed=1), **request))
    whole = offline(server.grpc_url, "spark_tts_offline", tts_inputs(voice(3.0, seed=1), **request))
    assert len(chunks) >= 4
    joined = np.concatenate(chunks)
    assert joined.size == whole.size == 300 * SAMPLES_PER_TOKEN
    # server-side cross-fade and left context: the streamed audio is the offline audio but near the seams
    per_token = np.abs(joined - whole).reshape(300, SAMPLES_PER_TOKEN).max(axis=1)
    assert np.median(per_token) < 1e-4 * max(1.0, float(np.abs(whole).max()))
    assert (per_token < 1e-4).mean() > 0.6


def test_per_request_sampling_changes_the_speech(server):
    wav = voice(2.0)
    first = offline(server.grpc_url, "spark_tts_offline", tts_inputs(wav, max_tokens=(20, "INT32")))
    same = offline(server.grpc_url, "spark_tts_offline", tts_inputs(wav, max_tokens=(20, "INT32")))
    other = offline(
        server.grpc_url, "spark_tts_offline", tts_inputs(wav, max_tokens=(20, "INT32"), random_seed=(5, "UINT64"))
    )
    assert np.array_equal(first, same)
    assert not np.array_equal(first, other)


def test_concurrent_requests_of_different_lengths_get_their_single_request_tokens(server):
    """Four references of different lengths at once (batched by the dynamic batcher when they meet) tokenize as
    they do alone."""
    wavs = [voice(seconds, seed) for seed, seconds in enumerate((1.1, 2.3, 0.7, 3.2))]

    def tokenize(wav: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            result = client.infer("audio_tokenizer", tts_inputs(wav, target=None, reference=None))
            return result.as_numpy("global_tokens"), result.as_numpy("semantic_tokens")
        finally:
            client.close()

    alone = [tokenize(wav) for wav in wavs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(tokenize, wavs * 2))
    for (global_alone, semantic_alone), (global_together, semantic_together) in zip(alone * 2, together, strict=True):
        assert np.array_equal(global_alone, global_together)
        assert np.array_equal(semantic_alone, semantic_together)
    assert len({semantic.size for _, semantic in alone}) == 4


def test_concurrency_four_streams(server):
    results: list[int] = []
    lock = threading.Lock()

    def one(seed: int) -> None:
        chunks = streamed(server.grpc_url, tts_inputs(voice(1.5, seed), max_tokens=(60 + seed, "INT32")))
        with lock:
            results.append(sum(chunk.size for chunk in chunks) // SAMPLES_PER_TOKEN)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(4)))
    assert sorted(results) == [60, 61, 62, 63]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (lambda: tts_inputs(voice(1.0), reference=None), "input 'reference_text' is missing"),
        (lambda: tts_inputs(voice(1.0), sample_rate=(22050, "INT32")), "must be 16000 Hz mono, got 22050 Hz"),
        (lambda: tts_inputs(voice(1.0), target=b"   "), "target_text is empty"),
        (lambda: tts_inputs(np.zeros(600 * SAMPLE_RATE, np.float32)), "reference audio is 600.0 s, longer than"),
        (lambda: tts_inputs(voice(1.0), target=b"caf\xe9"), "'target_text' is not valid UTF-8"),
        (lambda: tts_inputs(voice(1.0), max_tokens=(401, "INT32")), "max_tokens 401 is outside 1..400"),
        (lambda: tts_inputs(np.full(800, np.nan, np.float32)), "reference_wav holds NaN"),
        (lambda: tts_inputs(np.zeros(0, np.float32)), r"the reference audio is empty \(0 samples\): send the voice"),
        (lambda: tts_inputs(voice(1.0), top_p=(1.5, "FP32")), "top_p 1.5 is out of range"),
    ],
)
@pytest.mark.parametrize("model", ["spark_tts", "spark_tts_offline"])
def test_bad_requests_get_a_clear_error_and_the_server_keeps_serving(server, inputs, message, model):
    with pytest.raises(InferenceServerException, match=message):
        ask(server.grpc_url, model, inputs())
    audio = offline(server.grpc_url, "spark_tts_offline", tts_inputs(voice(1.0), max_tokens=(5, "INT32")))
    assert audio.size == 5 * SAMPLES_PER_TOKEN


def test_a_prompt_longer_than_max_input_len_is_refused_before_the_llm(server):
    # 14 s of reference (700 semantic tokens) is accepted, but not with a text of several hundred tokens
    long_text = " ".join(["speech"] * 400).encode()
    with pytest.raises(InferenceServerException, match="more than this deployment's max_input_len 1024: use at most"):
        offline(server.grpc_url, "spark_tts_offline", tts_inputs(voice(14.0), target=long_text))
    # a text that alone fills the prompt: no length of reference audio would do, so the text is what is named
    longer_text = " ".join(["speech"] * 1100).encode()
    with pytest.raises(InferenceServerException, match="the texts alone make a prompt of .* shorten the target text"):
        offline(server.grpc_url, "spark_tts_offline", tts_inputs(voice(1.0), target=longer_text))


@pytest.fixture(scope="module")
def mute_server(tmp_path_factory, trtdeploy_serve):
    checkpoint: Path = tmp_path_factory.mktemp("mute") / "Spark-TTS"
    write_random_checkpoint(checkpoint, speaks="nothing")
    request = BuildRequest(
        model="spark_tts",
        model_dir=checkpoint,
        gpu="cpu",
        mode="streaming",
        max_batch_size=2,
        max_output_len=16,
        output_root=tmp_path_factory.mktemp("mute-deployments"),
    )
    return trtdeploy_serve(run(request).deployment)


@pytest.mark.parametrize("model", ["spark_tts", "spark_tts_offline"])
def test_an_llm_answer_without_semantic_tokens_is_an_error_not_a_crash(mute_server, model):
    with pytest.raises(InferenceServerException, match="the LLM produced no semantic tokens"):
        ask(mute_server.grpc_url, model, tts_inputs(voice(1.0)))
    assert mute_server.poll() is None
