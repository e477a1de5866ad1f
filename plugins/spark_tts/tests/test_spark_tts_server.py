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

from trtdeploy.backend_utils import segment_seed
from trtdeploy.build import BuildRequest, run

pytestmark = pytest.mark.server

#: Small chunks, so that a few hundred tokens stream as several chunks.
STREAM_OPTIONS = {"chunk_seconds": "0.4", "chunk_growth": "2", "max_chunk_seconds": "4"}
#: The official client's --chunk-overlap-duration (0.1 s) in samples, the deployment's chunk_overlap_seconds.
OVERLAP = 1600


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
    numpy_types = {"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64, "BYTES": object}
    for name, (value, dtype) in scalars.items():
        inputs.append(tensor(name, np.array([[value]], dtype=numpy_types[dtype]), dtype))
    return inputs


def official_client_audio(chunks: list[np.ndarray], overlap: int = OVERLAP) -> np.ndarray:
    """What the official ``client_grpc.py --mode streaming`` saves, by its rule: the first chunk without its last
    ``overlap`` samples; for each later chunk, its first ``overlap`` samples faded in (0 to 1) over the previous
    chunk's last ``overlap`` faded out (1 to 0), then its samples between the two overlaps; at the end, the last
    chunk's last ``overlap`` samples."""
    fade_out, fade_in = np.linspace(1, 0, overlap), np.linspace(0, 1, overlap)
    audio = chunks[0][:-overlap]
    for index in range(1, len(chunks)):
        blended = chunks[index][:overlap] * fade_in + chunks[index - 1][-overlap:] * fade_out
        audio = np.concatenate([audio, blended, chunks[index][overlap:-overlap]])
    return np.concatenate([audio, chunks[-1][-overlap:]])


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
    """The whole audio of one request: streamed from ``spark_tts`` (as the official client rebuilds it), in one
    piece from ``spark_tts_offline``."""
    if model == "spark_tts":
        return official_client_audio(streamed(url, inputs, model))
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


def assert_offline_but_near_the_seams(audio: np.ndarray, whole: np.ndarray, tokens: int) -> None:
    """Server-side cross-fade and left context: streamed audio is the offline audio but near the seams."""
    assert audio.size == whole.size == tokens * SAMPLES_PER_TOKEN
    per_token = np.abs(audio - whole).reshape(tokens, SAMPLES_PER_TOKEN).max(axis=1)
    assert np.median(per_token) < 1e-4 * max(1.0, float(np.abs(whole).max()))
    assert (per_token < 1e-4).mean() > 0.6


SEEDED = {"max_tokens": (300, "INT32"), "random_seed": (11, "UINT64")}


def test_the_official_client_rebuilds_the_offline_audio_from_the_default_stream(server):
    chunks = streamed(server.grpc_url, tts_inputs(voice(3.0, seed=1), **SEEDED))
    whole = offline(server.grpc_url, "spark_tts_offline", tts_inputs(voice(3.0, seed=1), **SEEDED))
    finished = streamed(server.grpc_url, tts_inputs(voice(3.0, seed=1), **SEEDED, stream_format=(b"finished", "BYTES")))
    assert len(chunks) == len(finished) >= 4
    # each chunk after the first repeats the last 0.1 s of the one before
    for previous, chunk in zip(chunks, chunks[1:], strict=False):
        assert np.array_equal(chunk[:OVERLAP], previous[-OVERLAP:])
    rebuilt = official_client_audio(chunks)
    assert_offline_but_near_the_seams(rebuilt, whole, 300)
    # what the official client rebuilds is the finished stream, sample for sample (up to the fade's rounding)
    assert np.abs(rebuilt - np.concatenate(finished)).max() < 1e-6


@pytest.fixture(scope="module")
def lookahead_server(trtdeploy_deploy, trtdeploy_serve):
    """Chunks held back by the vocoder's receptive radius (38 tokens for the tiny BiCodec) before they are sent."""
    options = {**STREAM_OPTIONS, "chunk_seconds": "1", "vocoder_lookahead_tokens": "-1"}
    deployment = trtdeploy_deploy(
        "spark_tts", mode="streaming", max_input_len=1024, max_output_len=400, options=options
    )
    return trtdeploy_serve(deployment)


def test_with_a_lookahead_the_official_client_rebuilds_the_offline_audio_exactly(lookahead_server):
    chunks = streamed(lookahead_server.grpc_url, tts_inputs(voice(3.0, seed=1), **SEEDED))
    whole = offline(lookahead_server.grpc_url, "spark_tts_offline", tts_inputs(voice(3.0, seed=1), **SEEDED))
    assert len(chunks) >= 3
    rebuilt = official_client_audio(chunks)
    assert rebuilt.size == whole.size == 300 * SAMPLES_PER_TOKEN
    # every sample, seams included (float rounding of vocoder windows of other lengths aside)
    assert np.abs(rebuilt - whole).max() <= 1e-4 * max(1.0, float(np.abs(whole).max()))


def test_finished_chunks_play_one_after_another_as_the_offline_audio(server):
    request = tts_inputs(voice(3.0, seed=1), **SEEDED, stream_format=(b"finished", "BYTES"))
    chunks = streamed(server.grpc_url, request)
    whole = offline(server.grpc_url, "spark_tts_offline", tts_inputs(voice(3.0, seed=1), **SEEDED))
    assert len(chunks) >= 4
    assert_offline_but_near_the_seams(np.concatenate(chunks), whole, 300)
    # the official client's rule on chunks that do not overlap drops audio at the seams
    assert official_client_audio(chunks).size < whole.size - OVERLAP


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
            results.append(official_client_audio(chunks).size // SAMPLES_PER_TOKEN)

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


def test_an_unknown_stream_format_is_refused_by_name(server):
    inputs = tts_inputs(voice(1.0), max_tokens=(5, "INT32"), stream_format=(b"wav", "BYTES"))
    with pytest.raises(InferenceServerException, match="stream_format 'wav' is neither overlapped nor finished"):
        streamed(server.grpc_url, inputs)


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


def test_segment_seeds_are_the_request_seed_then_distinct_64_bit_values():
    for seed in (0, 11, 2**64 - 1):
        seeds = [segment_seed(seed, segment) for segment in range(1000)]
        assert seeds[0] == seed and len(set(seeds)) == 1000
        assert all(0 <= value < 2**64 for value in seeds)


@pytest.fixture(scope="module")
def noise_restarting_server(trtdeploy_checkpoint, tmp_path_factory, trtdeploy_serve):
    """The streaming deployment as it is on a TensorRT-LLM engine, whose noise restarts with every request: the
    entry is told so, and the torch engine behind it shows the seeds the BLS sends in the tokens it draws."""
    request = BuildRequest(
        model="spark_tts",
        model_dir=trtdeploy_checkpoint("spark_tts"),
        gpu="cpu",
        mode="streaming",
        max_batch_size=2,
        max_input_len=1024,
        max_output_len=400,
        options=STREAM_OPTIONS,
        output_root=tmp_path_factory.mktemp("noise-restarting"),
    )
    deployment = run(request).deployment
    entry = deployment.model_repo / "spark_tts" / "config.pbtxt"
    keyed = 'key: "llm_noise_keyed_by_position" value: { string_value: "true" }'
    assert keyed in entry.read_text()
    entry.write_text(entry.read_text().replace(keyed, keyed.replace("true", "false")))
    return trtdeploy_serve(deployment)


def test_each_streamed_segment_gets_its_own_seed_where_the_engine_restarts_the_noise(server, noise_restarting_server):
    def chunks(url: str) -> list[np.ndarray]:
        return streamed(url, tts_inputs(voice(3.0, seed=1), **SEEDED, stream_format=(b"finished", "BYTES")))

    one_seed, own_seeds = chunks(server.grpc_url), chunks(noise_restarting_server.grpc_url)
    # the first segment is asked with the request's seed: the same tokens, the same first chunk
    assert np.array_equal(one_seed[0], own_seeds[0])
    # later segments with seeds of their own draw other tokens
    assert not np.array_equal(one_seed[1], own_seeds[1])
    assert sum(chunk.size for chunk in own_seeds) == 300 * SAMPLES_PER_TOKEN
