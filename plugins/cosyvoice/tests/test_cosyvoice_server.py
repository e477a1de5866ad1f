"""CosyVoice2 and CosyVoice3 on the real tritonserver: tiny random checkpoints in the official layout, torch engine,
CPU, a streaming deployment each (its ``<entry>_offline`` answers in one piece).

A request whose target text is long enough that ``min_token_text_ratio`` times its text tokens exceeds
``max_tokens`` gets exactly ``max_tokens`` speech tokens (the LLM may not stop before), so its audio is exactly
``max_tokens x 960`` samples at 24 kHz.
"""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.server

GENERATIONS = ("cosyvoice2", "cosyvoice3")
SAMPLES_PER_TOKEN = 960
#: Many words, so that the minimum answer (2 tokens per text token) is above the caps the tests ask for.
LONG_TEXT = b" ".join([b"Synthetic speech keeps every test of this server short and exact."] * 4)
#: Small chunks, so that a short answer streams as several chunks.
STREAM_OPTIONS = {"first_chunk_tokens": "10", "chunk_growth": "2", "max_chunk_tokens": "20"}


def voice(seconds: float, seed: int = 0) -> np.ndarray:
    from trtdeploy.perf.tts import synthetic_voice

    return synthetic_voice(seconds, np.random.default_rng(seed), 16000)


def tts_arrays(
    wav: np.ndarray | None,
    target: bytes | None = LONG_TEXT,
    reference: bytes | None = b"A short reference sentence.",
    **scalars: tuple[object, str],
) -> list[tuple[str, np.ndarray, str]]:
    """The official client's request (reference_wav [1, N], reference_wav_len [1, 1], the texts [1, 1]) plus
    optional scalars ``name=(value, TYPE)``, as (name, array, Triton type)."""
    arrays = []
    if wav is not None:
        arrays.append(("reference_wav", wav.reshape(1, -1).astype(np.float32), "FP32"))
        arrays.append(("reference_wav_len", np.array([[wav.size]], dtype=np.int32), "INT32"))
    for name, value in (("reference_text", reference), ("target_text", target)):
        if value is not None:
            arrays.append((name, np.array([[value]], dtype=object), "BYTES"))
    numpy_types = {"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64, "BYTES": object}
    for name, (value, dtype) in scalars.items():
        arrays.append((name, np.array([[value]], dtype=numpy_types[dtype]), dtype))
    return arrays


def tts_inputs(*args, **kwargs) -> list[grpcclient.InferInput]:
    """:func:`tts_arrays` as gRPC inputs."""
    inputs = []
    for name, array, dtype in tts_arrays(*args, **kwargs):
        item = grpcclient.InferInput(name, list(array.shape), dtype)
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def offline(url: str, model: str, inputs: list[grpcclient.InferInput]) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.infer(model, inputs).as_numpy("waveform").reshape(-1)
    finally:
        client.close()


def streamed(url: str, model: str, inputs: list[grpcclient.InferInput]) -> list[np.ndarray]:
    """Every audio chunk of one streamed request, read as the official client reads them (until the empty final
    response); InferenceServerException if the stream answers an error."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        chunks = []
        while True:
            result, error = answers.get(timeout=300)
            if error is not None:
                raise error
            if result.get_response().parameters["triton_final_response"].bool_param:
                return chunks
            chunks.append(result.as_numpy("waveform").reshape(-1))
    finally:
        client.stop_stream()
        client.close()


@pytest.fixture(scope="module", params=GENERATIONS)
def served(request, trtdeploy_deploy, trtdeploy_serve):
    deployment = trtdeploy_deploy(
        request.param, mode="streaming", max_input_len=1024, max_output_len=200, options=STREAM_OPTIONS
    )
    server = trtdeploy_serve(deployment)
    return request.param, server.grpc_url, server.http_url


def test_offline_audio_is_24_khz_with_the_length_the_tokens_imply(served):
    generation, url, _ = served
    audio = offline(url, f"{generation}_offline", tts_inputs(voice(2.0), max_tokens=(30, "INT32")))
    assert audio.dtype == np.float32 and audio.size == 30 * SAMPLES_PER_TOKEN
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 0.99 and np.abs(audio).max() > 0


def test_streamed_chunks_join_to_the_offline_length_and_stay_close_to_it(served):
    generation, url, _ = served
    inputs = {"max_tokens": (47, "INT32"), "random_seed": (7, "UINT64")}
    whole = offline(url, f"{generation}_offline", tts_inputs(voice(2.0), **inputs))
    chunks = streamed(url, generation, tts_inputs(voice(2.0), **inputs))
    assert len(chunks) >= 3  # 10, 20, 20 tokens, then the rest
    joined = np.concatenate(chunks)
    assert joined.size == whole.size == 47 * SAMPLES_PER_TOKEN  # no gap, no repeat
    # The same tokens (seeded); the flow of a streamed chunk sees only its chunk's past (chunk-causal attention),
    # and CosyVoice2's vocoder draws its own noise per chunk: close, not equal. Measured on these tiny random models:
    # a relative RMS difference of 0.14 (both generations); audio shifted or repeated by a chunk gives about 1.4.
    difference = np.sqrt(np.mean((joined - whole) ** 2)) / np.sqrt(np.mean(whole**2))
    assert difference < 0.4


@pytest.mark.parametrize(("cap", "chunks"), [(13, 2), (33, 3), (40, 3)])
def test_a_cap_on_a_chunk_boundary_still_sends_that_chunk_then_the_rest(served, cap, chunks):
    """Chunks of 10, 20, 20 tokens, each once its 3 read-ahead tokens are there: a cap of 13 or 33 tokens completes a
    chunk (sent), and the last call brings the 3 tokens read ahead; a cap of 40 ends between chunks."""
    generation, url, _ = served
    audio = streamed(url, generation, tts_inputs(voice(1.5), max_tokens=(cap, "INT32"), random_seed=(2, "UINT64")))
    assert len(audio) == chunks and all(chunk.size for chunk in audio)
    assert sum(chunk.size for chunk in audio) == cap * SAMPLES_PER_TOKEN


def test_a_registered_voice_speaks_as_the_reference_did(served):
    generation, url, _ = served
    wav = voice(2.5, seed=3)
    seeded = {"max_tokens": (20, "INT32"), "random_seed": (11, "UINT64")}
    with_reference = offline(url, f"{generation}_offline", tts_inputs(wav, speaker_id=("alice", "BYTES"), **seeded))
    by_id = offline(
        url, f"{generation}_offline", tts_inputs(None, reference=None, speaker_id=("alice", "BYTES"), **seeded)
    )
    np.testing.assert_array_equal(by_id, with_reference)
    with pytest.raises(InferenceServerException, match="no voice is registered as 'bob'"):
        offline(url, f"{generation}_offline", tts_inputs(None, reference=None, speaker_id=("bob", "BYTES")))


def test_the_official_clients_zero_padding_past_reference_wav_len_changes_nothing(served):
    """client_grpc.py pads the reference with zeros to a whole number of seconds and sends the true length."""
    generation, url, _ = served
    wav, seeded = voice(1.7, seed=5), {"max_tokens": (15, "INT32"), "random_seed": (3, "UINT64")}
    padded = tts_inputs(np.concatenate([wav, np.zeros(16000 - wav.size % 16000, np.float32)]), **seeded)
    padded[1].set_data_from_numpy(np.array([[wav.size]], dtype=np.int32))  # reference_wav_len: the true length
    expected = offline(url, f"{generation}_offline", tts_inputs(wav, **seeded))
    np.testing.assert_array_equal(offline(url, f"{generation}_offline", padded), expected)


def test_the_official_http_clients_request_gets_the_same_audio(served):
    """client_http.py sends the same tensors as JSON over HTTP."""
    import tritonclient.http as httpclient

    generation, url, http_url = served
    wav, seeded = voice(1.5, seed=8), {"max_tokens": (12, "INT32"), "random_seed": (5, "UINT64")}
    inputs = []
    for name, array, dtype in tts_arrays(wav, **seeded):
        item = httpclient.InferInput(name, list(array.shape), dtype)
        item.set_data_from_numpy(array, binary_data=False)  # JSON, as client_http.py sends it
        inputs.append(item)
    client = httpclient.InferenceServerClient(http_url)
    try:
        audio = client.infer(f"{generation}_offline", inputs).as_numpy("waveform").reshape(-1)
    finally:
        client.close()
    np.testing.assert_array_equal(audio, offline(url, f"{generation}_offline", tts_inputs(wav, **seeded)))


def test_four_requests_at_once_each_get_their_audio(served):
    generation, url, _ = served
    caps = [12, 17, 22, 27]

    def ask(cap: int) -> np.ndarray:
        return offline(url, f"{generation}_offline", tts_inputs(voice(1.5, cap), max_tokens=(cap, "INT32")))

    with ThreadPoolExecutor(4) as pool:
        audios = list(pool.map(ask, caps))
    assert [audio.size for audio in audios] == [cap * SAMPLES_PER_TOKEN for cap in caps]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (lambda: tts_inputs(voice(1.0), target=None), "target_text"),
        (lambda: tts_inputs(voice(1.0), target=b"   "), "nothing to say"),
        (lambda: tts_inputs(voice(1.0), sample_rate=(24000, "INT32")), "must be 16000 Hz"),
        (lambda: tts_inputs(voice(600.0)), "longer than the 30 s"),
        (lambda: tts_inputs(np.full(16000, np.nan, dtype=np.float32)), "NaN"),
        (lambda: tts_inputs(voice(1.0)[:150]), "too short for a speaker embedding"),
        (lambda: tts_inputs(voice(1.0)[:500]), "too short for one speech token"),
        (lambda: tts_inputs(voice(1.0), target=b"\xff\xfe bad"), "not valid UTF-8"),
        (lambda: tts_inputs(None, reference=None, speaker_id=("nobody", "BYTES")), "no voice is registered"),
        (lambda: tts_inputs(voice(1.0), speaker_id=("../etc", "BYTES")), "not a valid id"),
        (lambda: tts_inputs(voice(1.0), repetition_penalty=(0.0, "FP32")), "repetition_penalty 0 is out of range"),
        (lambda: tts_inputs(voice(1.0), max_tokens=(0, "INT32")), "max_tokens 0 is outside 1..200"),
    ],
)
def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(served, inputs, message):
    generation, url, _ = served
    with pytest.raises(InferenceServerException, match=message):
        offline(url, f"{generation}_offline", inputs())
    audio = offline(url, f"{generation}_offline", tts_inputs(voice(1.0), max_tokens=(5, "INT32")))
    assert audio.size == 5 * SAMPLES_PER_TOKEN


def test_tensorrt_llms_stop_tokens_hold_back_until_the_minimum_too(trtdeploy_checkpoint, tmp_path):
    """On TensorRT-LLM the entry sends end_id and the other stop tokens as stop words, and min_length holds back
    end_id alone. Here an LLM that wants eos2 (a stop token, not the end token) at every step is served by the
    torch engine both ways: ``cosyvoice2_offline`` as the torch engine is asked (every stop token held back until
    the minimum), ``cosyvoice2`` made to ask as on TensorRT-LLM. Both must speak exactly the minimum."""
    import shutil

    import torch
    from trtdeploy_cosyvoice.generations import SPEECH_TOKENS

    from trtdeploy.build import BuildRequest, run
    from trtdeploy.server import launch

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(trtdeploy_checkpoint("cosyvoice2"), checkpoint)
    state = torch.load(checkpoint / "llm.pt", weights_only=True)
    state["llm_decoder.bias"][SPEECH_TOKENS + 1] = 30.0
    torch.save(state, checkpoint / "llm.pt")
    request = BuildRequest(
        model="cosyvoice2", model_dir=checkpoint, gpu="cpu", mode="streaming", max_batch_size=1, max_input_len=1024,
        max_output_len=200, options=STREAM_OPTIONS, output_root=tmp_path / "deployments",
    )  # fmt: skip
    deployment = run(request).deployment
    entry = deployment.model_repo / "cosyvoice2" / "config.pbtxt"
    asked_as_torch = 'key: "llm_reads_end_tokens" value: { string_value: "true" }'
    assert asked_as_torch in entry.read_text()
    entry.write_text(entry.read_text().replace(asked_as_torch, asked_as_torch.replace("true", "false")))
    with launch(deployment.model_repo, models=deployment.models, log_file=tmp_path / "server.log") as server:
        target = b"Four short words here."
        whole = offline(server.grpc_url, "cosyvoice2_offline", tts_inputs(voice(2.0), target=target))
        chunks = streamed(server.grpc_url, "cosyvoice2", tts_inputs(voice(2.0), target=target))
    tokens = whole.size // SAMPLES_PER_TOKEN
    assert whole.size == tokens * SAMPLES_PER_TOKEN and 10 < tokens < 200  # the minimum: 2 per text token
    assert len(chunks) > 1 and sum(chunk.size for chunk in chunks) == whole.size
