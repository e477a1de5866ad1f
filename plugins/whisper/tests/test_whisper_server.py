"""Whisper on the real tritonserver: the tiny random checkpoint in the Hugging Face layout, torch engine, CPU.

One streaming deployment serves both entries: ``whisper_bls`` (decoupled: the transcript so far, whenever it grows,
each window's tokens asked for in segments of 8, then 4 times more each, the plugin's defaults) and
``whisper_bls_offline``. The random model never says its end token (see ``checkpoint.py``), so every window's
transcript is its ``MAX_NEW_TOKENS`` tokens of text, which differ with the audio.
"""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from trtdeploy.perf.tts import synthetic_voice

pytestmark = pytest.mark.server

SAMPLE_RATE = 16000
#: Tokens per window: short, so that CPU decoding stays fast; every test's transcript is this many tokens a window.
MAX_OUTPUT_LEN = 24
MAX_AUDIO_SECONDS = 90
DEFAULT_PREFIX = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    return synthetic_voice(seconds, np.random.default_rng(seed), SAMPLE_RATE)


def _tensor(name: str, array: np.ndarray, dtype: str) -> grpcclient.InferInput:
    item = grpcclient.InferInput(name, list(array.shape), dtype)
    item.set_data_from_numpy(array)
    return item


def asr_inputs(
    wavs: list[np.ndarray],
    prefix: str | None = "",
    pad_to: int | None = None,
    lengths: bool = True,
    **extras: tuple[object, str],
) -> list[grpcclient.InferInput]:
    """``WAV`` [N, samples] (rows zero-padded to the longest, or to ``pad_to``) with ``WAV_LENS`` [N, 1] (unless not
    ``lengths``), the same ``TEXT_PREFIX`` for every row, and optional extras ``NAME=(value, triton type)``."""
    width = pad_to or max(wav.size for wav in wavs)
    batch = np.zeros((len(wavs), width), dtype=np.float32)
    for row, wav in enumerate(wavs):
        batch[row, : wav.size] = wav
    inputs = [_tensor("WAV", batch, "FP32")]
    if lengths:
        inputs.append(_tensor("WAV_LENS", np.array([[wav.size] for wav in wavs], dtype=np.int32), "INT32"))
    if prefix is not None:
        inputs.append(_tensor("TEXT_PREFIX", np.array([[prefix.encode()]] * len(wavs), dtype=object), "BYTES"))
    numpy_types = {"INT32": np.int32, "BOOL": np.bool_}
    for name, (value, dtype) in extras.items():
        inputs.append(_tensor(name, np.array([[value]] * len(wavs), dtype=numpy_types[dtype]), dtype))
    return inputs


def offline(url: str, inputs: list[grpcclient.InferInput], model: str = "whisper_bls_offline") -> list[str]:
    """The transcript of each row."""
    client = grpcclient.InferenceServerClient(url)
    try:
        found = client.infer(model, inputs).as_numpy("TRANSCRIPTS")
        return [row[0].decode() for row in found]
    finally:
        client.close()


def streamed(url: str, inputs: list[grpcclient.InferInput], model: str = "whisper_bls") -> list[list[str]]:
    """Every response of one streamed request (each row's transcript so far); InferenceServerException if the
    stream answers an error."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        responses = []
        while True:
            result, error = answers.get(timeout=300)
            if error is not None:
                raise error
            if result.get_response().parameters["triton_final_response"].bool_param:
                return responses
            responses.append([row[0].decode() for row in result.as_numpy("TRANSCRIPTS")])
    finally:
        client.stop_stream()
        client.close()


@pytest.fixture(scope="module")
def deployment(trtdeploy_deploy):
    """Eight BLS instances of each entry and eight LLM slots: eight streams run at once."""
    return trtdeploy_deploy(
        "whisper",
        mode="streaming",
        max_batch_size=8,
        max_output_len=MAX_OUTPUT_LEN,
        options={"max_audio_seconds": str(MAX_AUDIO_SECONDS)},
    )


@pytest.fixture(scope="module")
def server(deployment, trtdeploy_serve):
    return trtdeploy_serve(deployment)


@pytest.fixture(scope="module")
def url(server):
    return server.grpc_url


@pytest.fixture(scope="module")
def reference(deployment):
    """transformers' greedy decoding of the same checkpoint on the same features: ``reference(wav, prefix, n)``."""
    import torch
    from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration

    folder = str(deployment.llm_dir)
    model = WhisperForConditionalGeneration.from_pretrained(folder, local_files_only=True).eval()
    extractor = WhisperFeatureExtractor.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)

    def transcribe(wav: np.ndarray, prefix: str = DEFAULT_PREFIX, max_new_tokens: int = MAX_OUTPUT_LEN) -> str:
        features = extractor(wav, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        prompt = tokenizer(prefix, add_special_tokens=False).input_ids
        ids = torch.tensor([prompt])
        with torch.no_grad():
            encoded = model.get_encoder()(features)
            for _ in range(max_new_tokens):
                logits = model(encoder_outputs=encoded, decoder_input_ids=ids).logits[0, -1]
                token = int(logits.argmax())
                if token == tokenizer.eos_token_id:
                    break
                ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
        return tokenizer.decode(ids[0, len(prompt) :].tolist(), skip_special_tokens=True).strip()

    return transcribe


def test_offline_transcripts_are_transformers_greedy_decoding(url, reference):
    wav = speech(4.0, seed=1)
    (text,) = offline(url, asr_inputs([wav]))
    assert text and text == reference(wav)
    german = "<|startofprev|> Triton<|startoftranscript|><|de|><|transcribe|><|notimestamps|>"
    assert offline(url, asr_inputs([wav], prefix=german))[0] == reference(wav, german)
    # a token cap per request, and the whole default prompt spelled out
    capped = offline(url, asr_inputs([wav], prefix=DEFAULT_PREFIX, MAX_NEW_TOKENS=(5, "INT32")))[0]
    assert capped == reference(wav, max_new_tokens=5) and len(capped) < len(text)
    # without TEXT_PREFIX (optional here), the default prompt
    assert offline(url, asr_inputs([wav], prefix=None)) == [text]


def test_streaming_sends_the_transcript_so_far_and_ends_on_the_offline_one(url, reference):
    wav = speech(3.0, seed=2)
    responses = streamed(url, asr_inputs([wav]))
    assert len(responses) == 2  # one per segment: 8 tokens, then the window's other 16
    assert responses[0] == [reference(wav, max_new_tokens=8)]  # the first segment's text
    assert responses[-1] == offline(url, asr_inputs([wav]))


def llm_requests(url: str) -> int:
    """Requests the LLM model has served so far (Triton's statistics)."""
    client = grpcclient.InferenceServerClient(url)
    try:
        (stats,) = client.get_inference_statistics("tensorrt_llm", as_json=True)["model_stats"]
        return int(stats.get("inference_count", 0))
    finally:
        client.close()


def test_a_windows_token_cap_holds_across_its_segments(url, reference):
    """45 s with MAX_NEW_TOKENS 20 and IGNORE_EOS: two windows, each asked for in two segments (8 + 12 tokens); the
    streamed transcript ends on the offline one, which is each window's first 20 tokens of greedy decoding."""
    wav = speech(45.0, seed=4)
    capped = asr_inputs([wav], MAX_NEW_TOKENS=(20, "INT32"), IGNORE_EOS=(True, "BOOL"))
    (expected,) = offline(url, capped)
    windows = [wav[: 30 * SAMPLE_RATE], wav[30 * SAMPLE_RATE :]]
    assert expected == " ".join(reference(window, max_new_tokens=20) for window in windows)
    assert expected != offline(url, asr_inputs([wav]))[0]  # the cap shortened it
    before = llm_requests(url)
    responses = [row[0] for row in streamed(url, capped)]
    assert llm_requests(url) - before == 4
    assert responses[-1] == expected
    assert len(responses) == 4 and responses[1] == reference(windows[0], max_new_tokens=20)


def test_a_batch_and_requests_that_arrive_together_get_their_single_transcripts(url):
    wavs = [speech(seconds, seed) for seed, seconds in enumerate((2.5, 4.0, 1.3), start=10)]
    singles = [offline(url, asr_inputs([wav]))[0] for wav in wavs]
    assert len(set(singles)) == len(singles)  # the audio matters: a wrong pairing would show
    assert offline(url, asr_inputs(wavs)) == singles
    with ThreadPoolExecutor(len(wavs)) as pool:  # dynamic batching on the BLS and the LLM
        together = list(pool.map(lambda wav: offline(url, asr_inputs([wav]))[0], wavs))
    assert together == singles


def test_seventy_seconds_are_three_windows_transcribed_and_joined(url):
    wav = np.concatenate([speech(30.0, seed=20), speech(30.0, seed=21), speech(10.0, seed=22)])
    parts = [offline(url, asr_inputs([wav[start : start + 30 * SAMPLE_RATE]]))[0] for start in (0, 480000, 960000)]
    assert len(set(parts)) == 3
    (whole,) = offline(url, asr_inputs([wav]))
    assert whole == " ".join(parts)
    # streaming: window after window, each response the transcript so far
    responses = [row[0] for row in streamed(url, asr_inputs([wav]))]
    assert responses[-1] == whole
    assert parts[0] in responses and " ".join(parts[:2]) in responses


def test_the_official_clients_requests_and_reading(url):
    """What TensorRT-LLM's tools/whisper/client.py sends: WAV zero-padded to a multiple of 10 s with WAV_LENS, the
    prompt as TEXT_PREFIX [1, 1]; streaming, it keeps the last response (no empty final one asked for).
    Triton-ASR-Client's whisper requests are the same without WAV_LENS, to the model named ``whisper``: the
    padding is transcribed too, which changes nothing, since every window is padded with zeros to 30 s before its
    features anyway."""
    wav = speech(33.7, seed=3)
    expected = offline(url, asr_inputs([wav]))
    official = asr_inputs([wav], prefix=DEFAULT_PREFIX, pad_to=40 * SAMPLE_RATE)
    assert offline(url, official) == expected
    asr_client = asr_inputs([wav], prefix=DEFAULT_PREFIX, pad_to=40 * SAMPLE_RATE, lengths=False)
    assert offline(url, asr_client, model="whisper") == expected
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("whisper_bls", official, outputs=[grpcclient.InferRequestedOutput("TRANSCRIPTS")])
        texts = []
        while not texts or texts[-1] != expected[0]:
            result, error = answers.get(timeout=300)
            assert error is None
            texts.append(result.as_numpy("TRANSCRIPTS")[0][0].decode())
    finally:
        client.stop_stream()
        client.close()


BAD_REQUESTS = {
    "sample rate": ({"SAMPLE_RATE": (8000, "INT32")}, "must be 16000 Hz mono, got SAMPLE_RATE 8000"),
    "unknown language": ({"prefix": "<|startoftranscript|><|xx|><|transcribe|><|notimestamps|>"}, "names <|xx|>"),
    "long prefix": ({"prefix": "<|startofprev|>" + " hello" * 300 + DEFAULT_PREFIX}, "more than this deployment's"),
    "token cap": ({"MAX_NEW_TOKENS": (500, "INT32")}, f"MAX_NEW_TOKENS 500 is outside 1..{MAX_OUTPUT_LEN}"),
    "empty": ({"wav": np.zeros(0, dtype=np.float32)}, "the audio is empty"),
    "NaN": ({"wav": np.full(1600, np.nan, dtype=np.float32)}, "NaN or infinite"),
    "too long": ({"wav": np.zeros((MAX_AUDIO_SECONDS + 5) * SAMPLE_RATE, np.float32)}, "max_audio_seconds 90"),
}


@pytest.mark.parametrize("model", ["whisper_bls_offline", "whisper_bls"])
@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_requests_get_an_error_response_and_the_server_keeps_serving(url, model, case):
    changes, message = BAD_REQUESTS[case]
    extras = {name: value for name, value in changes.items() if name not in ("wav", "prefix")}
    bad = asr_inputs([changes.get("wav", speech(1.0))], prefix=changes.get("prefix", ""), **extras)
    ask = offline if model == "whisper_bls_offline" else streamed
    with pytest.raises(InferenceServerException, match=message.replace("|", "\\|")):
        ask(url, bad, model)
    assert ask(url, asr_inputs([speech(1.0)]), model)


def test_eight_concurrent_streams_each_end_on_their_offline_transcript(server, url):
    """Eight streams at once, each asking the LLM in segments (python-backend stubs reading decoupled streams
    crashed the server at four on a GPU host: see the README)."""
    wavs = [speech(2.0 + 0.3 * index, seed) for index, seed in enumerate(range(30, 38))]
    with ThreadPoolExecutor(len(wavs)) as pool:
        streams = list(pool.map(lambda wav: streamed(url, asr_inputs([wav])), wavs))
    expected = [offline(url, asr_inputs([wav])) for wav in wavs]
    assert [responses[-1] for responses in streams] == expected
    assert all(len(responses) > 1 for responses in streams)
    assert server.poll() is None
