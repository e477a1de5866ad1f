"""Whisper in the torch engine, on the CPU without Triton: greedy tokens against transformers, the encoder-decoder
inputs of the LLM contract and their refusals, and the engine's build-time side."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import numpy as np  # noqa: E402
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration  # noqa: E402
from tritonclient.grpc import model_config_pb2  # noqa: E402

from trtdeploy.engines.contract import encoder_decoder_inputs, parse_request  # noqa: E402
from trtdeploy.engines.torch import TorchEngine, unsupported_reason  # noqa: E402
from trtdeploy.engines.torch.runtime import (  # noqa: E402
    NEVER_STOP,
    GenerationRequest,
    SamplingParams,
    WhisperModel,
    load_generator,
)
from trtdeploy.errors import UsageError  # noqa: E402
from trtdeploy.repo import TemplateSource, render_repository, validate_config  # noqa: E402
from trtdeploy.spec import BuildContext, BuildPoint  # noqa: E402

from .contract_helpers import RecordingSink  # noqa: E402
from .torch_helpers import write_tiny_model, write_tiny_whisper  # noqa: E402

NEW_TOKENS = 20
SAMPLE_RATE = 16000
#: <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>, and the same after a <|startofprev|> text prompt.
PROMPTS = (
    [50258, 50259, 50359, 50363],
    [50361, 440, 1002, 50258, 50259, 50359, 50363],
    [50258, 50260, 50358],
)


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return write_tiny_whisper(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def hf_whisper(whisper_dir):
    return WhisperForConditionalGeneration.from_pretrained(whisper_dir).eval()


@pytest.fixture(scope="module")
def generator(whisper_dir):
    gen = load_generator(whisper_dir, max_slots=8, max_input_len=16, max_seq_len=64)
    yield gen
    gen.close()


def waveform(seconds: float, tone: float, seed: int) -> np.ndarray:
    """A few seconds of a tone that glides up, with noise."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    noise = np.random.default_rng(seed).standard_normal(len(t))
    return (0.3 * np.sin(2 * np.pi * tone * t * (1 + t / 4)) + 0.05 * noise).astype(np.float32)


def features_of(wave: np.ndarray) -> np.ndarray:
    """Whisper's log-mel features ``[3000, 80]`` (30 s, padded) of a waveform."""
    extractor = WhisperFeatureExtractor(feature_size=80)
    return extractor(wave, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features[0].T


@pytest.fixture(scope="module")
def clips():
    return [
        features_of(waveform(seconds, tone, seed)) for seconds, tone, seed in ((3, 440, 0), (5, 220, 1), (2, 900, 2))
    ]


def hf_generate(model, features: np.ndarray, prompt: list[int]) -> list[int]:
    """transformers' greedy tokens after the decoder prompt (30 s features: its encoder takes nothing else)."""
    out = model.generate(
        torch.from_numpy(features.T[None]),
        decoder_input_ids=torch.tensor([prompt]),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=None,
        begin_suppress_tokens=None,
        suppress_tokens=None,
    )
    return out[0].tolist()


def masked_reference(model, features: np.ndarray, prompt: list[int]) -> list[int]:
    """Greedy tokens with transformers' own layers run on the features' frames alone (no 3000-frame padding, an odd
    last frame dropped): what TensorRT-LLM's encoder computes without input padding."""
    encoder = model.model.encoder
    frames = len(features) // 2 * 2
    with torch.no_grad():
        x = torch.from_numpy(features[:frames].T[None])
        x = torch.nn.functional.gelu(encoder.conv2(torch.nn.functional.gelu(encoder.conv1(x)))).transpose(1, 2)
        x = x + encoder.embed_positions.weight[: x.shape[1]]
        for layer in encoder.layers:
            x = layer(x, None)
        hidden = encoder.layer_norm(x)
        ids = torch.tensor([prompt])
        for _ in range(NEW_TOKENS):
            logits = model(encoder_outputs=(hidden,), decoder_input_ids=ids).logits[:, -1]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    return ids[0, len(prompt) :].tolist()


def request(features: np.ndarray, prompt: list[int], new_tokens: int = NEW_TOKENS, **kwargs) -> GenerationRequest:
    return GenerationRequest([prompt], new_tokens, encoder_features=[features], **{"end_id": NEVER_STOP, **kwargs})


def run_all(gen, requests):
    sinks = [RecordingSink() for _ in requests]
    for item, sink in zip(requests, sinks, strict=True):
        gen.submit(item, sink)
    for sink in sinks:
        sink.wait()
    return sinks


# --- greedy tokens against transformers -------------------------------------------------------------------------


def test_requests_together_and_alone_equal_hf_generate(generator, hf_whisper, clips):
    cases = list(zip(clips, PROMPTS, strict=True))
    expected = [hf_generate(hf_whisper, features, prompt) for features, prompt in cases]
    assert len({tuple(tokens) for tokens in expected}) == len(cases)  # the clips and prompts make different answers
    together = run_all(generator, [request(features, prompt) for features, prompt in cases])
    assert [sink.error for sink in together] == [None] * len(cases)
    assert [sink.tokens for sink in together] == expected
    for (features, prompt), tokens in zip(cases, expected, strict=True):
        assert run_all(generator, [request(features, prompt)])[0].tokens == tokens


def test_prompts_arriving_while_others_decode_are_fed_to_the_steps(whisper_dir, hf_whisper, clips):
    """A short prompt admitted beside running sequences goes through the decode steps a token at a time, with the
    same tokens as a prefill; a penalised request or a prompt over ``max_fed_prompt`` tokens is prefilled."""
    gen = load_generator(whisper_dir, max_slots=8, max_input_len=32, max_seq_len=448)
    try:
        running = RecordingSink()
        gen.submit(request(clips[0], PROMPTS[0], new_tokens=440, streaming=True), running)
        deadline = time.monotonic() + 30
        while not running.streamed and time.monotonic() < deadline:
            time.sleep(0.001)
        long_prompt = [50361, *range(440, 450), *PROMPTS[0]]
        penalised = SamplingParams(top_k=1, repetition_penalty=1.0001)
        prefilled = run_all(
            gen, [request(clips[1], long_prompt, 4), request(clips[2], PROMPTS[2], 4, sampling=penalised)]
        )
        assert [sink.error for sink in prefilled] == [None, None]
        assert gen.fed_prompts == 0 and not running.done.is_set()
        cases = [(clips[1], PROMPTS[1]), (clips[2], PROMPTS[2])]
        fed = run_all(gen, [request(features, prompt) for features, prompt in cases])
        assert gen.fed_prompts == 2
        assert [sink.tokens for sink in fed] == [hf_generate(hf_whisper, *case) for case in cases]
        assert running.wait().tokens[:NEW_TOKENS] == hf_generate(hf_whisper, clips[0], PROMPTS[0])
    finally:
        gen.close()


def test_shorter_features_equal_the_encoder_over_their_own_frames(generator, hf_whisper, clips):
    """Features of 2 s, of 3.01 s (an odd frame count) and of 30 s in one batch: each is encoded over its own
    frames, the padding up to the longest masked out (transformers' encoder insists on 3000 frames, so the
    reference runs its layers on the frames alone)."""
    cases = [(clips[2][:200], PROMPTS[0]), (clips[0][:301], PROMPTS[1]), (clips[1], PROMPTS[2])]
    sinks = run_all(generator, [request(features, prompt) for features, prompt in cases])
    assert [sink.tokens for sink in sinks] == [masked_reference(hf_whisper, *case) for case in cases]
    assert sinks[2].tokens == hf_generate(hf_whisper, *cases[2])  # the reference agrees with transformers at 30 s


def test_a_request_of_several_rows_and_sequences(generator, hf_whisper, clips):
    """Two prompts of one request, each run as two sequences that share one encoder pass."""
    batch = GenerationRequest(
        [PROMPTS[0], PROMPTS[1]],
        NEW_TOKENS,
        end_id=NEVER_STOP,
        encoder_features=[clips[0], clips[1]],
        num_return_sequences=2,
    )
    outputs = run_all(generator, [batch])[0].outputs
    expected = [hf_generate(hf_whisper, clips[0], PROMPTS[0]), hf_generate(hf_whisper, clips[1], PROMPTS[1])]
    assert [(output.row, output.index, list(output)) for output in outputs] == [
        (row, index, expected[row]) for row in (0, 1) for index in (0, 1)
    ]


def test_end_id_stops_and_the_prompt_can_lead_the_output(generator, hf_whisper, clips):
    reference = hf_generate(hf_whisper, clips[0], PROMPTS[0])
    stop = reference[5]
    stopped = run_all(generator, [request(clips[0], PROMPTS[0], end_id=stop)])[0]
    assert stopped.tokens == reference[: reference.index(stop)]
    with_prompt = run_all(generator, [request(clips[0], PROMPTS[0], exclude_input=False)])[0]
    assert with_prompt.tokens == PROMPTS[0] + reference


def test_fp16_features_are_cast_to_the_model(generator, clips):
    features = clips[1]
    exact, half = run_all(generator, [request(features, PROMPTS[0]), request(features.astype(np.float16), PROMPTS[0])])
    assert half.error is None and len(half.tokens) == NEW_TOKENS
    # fp16 rounding of the features moves the logits a little; the greedy start of the answer stays
    assert half.tokens[:3] == exact.tokens[:3]


def test_output_len_is_capped_by_max_seq_len(generator, clips):
    sink = run_all(generator, [request(clips[0], PROMPTS[1], new_tokens=1000)])[0]
    assert len(sink.tokens) == 64 - len(PROMPTS[1])


# --- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"encoder_features": None}, "encoder_input_features missing: this is an encoder-decoder model"),
        (
            {"encoder_features": [np.zeros((100, 128), np.float32)]},
            r"of shape \[100, 128\]: this model takes \[frames, 80\]",
        ),
        ({"encoder_features": [np.zeros((3002, 80), np.float32)]}, "hold 3002 mel frames: this model takes 2 to 3000"),
        ({"encoder_features": [np.zeros((1, 80), np.float32)]}, "hold 1 mel frames: this model takes 2 to 3000"),
        ({"return_context_logits": True}, "return_context_logits: the torch engine returns no context logits"),
        ({"input_ids": [list(range(50258, 50258 + 17))]}, "input length 17 exceeds max_input_len 16"),
    ],
)
def test_generator_refusals(generator, clips, change, message):
    fields = {"input_ids": [PROMPTS[0]], "max_new_tokens": 4, "encoder_features": [clips[0]], **change}
    sink = run_all(generator, [GenerationRequest(**fields)])[0]
    assert sink.error is not None
    assert re.search(message, sink.error)


def test_a_decoder_only_model_refuses_features(tmp_path, clips):
    gen = load_generator(write_tiny_model(tmp_path / "qwen2"), max_slots=2, max_input_len=16, max_seq_len=32)
    try:
        sink = run_all(gen, [GenerationRequest([[5, 6]], 4, encoder_features=[clips[0]])])[0]
    finally:
        gen.close()
    assert sink.error == "encoder_input_features: this is a decoder-only model, it takes input_ids alone"


def test_max_seq_len_beyond_the_decoder_positions_is_refused(whisper_dir):
    with pytest.raises(ValueError, match="max_seq_len 512 exceeds the decoder's 448 positions"):
        load_generator(whisper_dir, max_seq_len=512)
    with pytest.raises(ValueError, match="exceeds Whisper's max_target_positions 448"):
        WhisperModel.from_pretrained(
            str(whisper_dir), dtype=torch.float32, device="cpu", max_slots=1, max_seq_len=449, cuda_graphs=False
        )


# --- the contract's encoder-decoder inputs ----------------------------------------------------------------------


def contract_inputs(frames: int = 3000, dtype=np.float16, **extra) -> dict[str, np.ndarray]:
    """A request as TensorRT-LLM's whisper_bls sends it."""
    inputs = {
        "encoder_input_features": np.arange(frames * 80, dtype=dtype).reshape(1, frames, 80),
        "encoder_output_lengths": np.array([[frames // 2]], np.int32),
        "input_lengths": np.array([[frames]], np.int32),
        "decoder_input_ids": np.array([PROMPTS[0]], np.int32),
        "request_output_len": np.array([[50]], np.int32),
        "end_id": np.array([[50257]], np.int32),
        "pad_id": np.array([[50257]], np.int32),
        "streaming": np.array([[False]]),
    }
    inputs.update(extra)
    return {name: value for name, value in inputs.items() if value is not None}


def parse(inputs, encoder_decoder=True, decoupled=False):
    return parse_request(inputs, decoupled=decoupled, exclude_input=True, encoder_decoder=encoder_decoder)


def test_parse_reads_the_encoder_decoder_inputs():
    parsed = parse(contract_inputs())
    assert parsed.input_ids == [PROMPTS[0]] and parsed.max_new_tokens == 50 and parsed.end_id == 50257
    (features,) = parsed.encoder_features
    assert features.shape == (3000, 80) and features.dtype == np.float16
    assert features[1, 0] == 80


def test_parse_cuts_padded_features_and_decoder_prompts():
    inputs = contract_inputs(
        frames=400,
        dtype=np.float32,
        input_lengths=np.array([[300]], np.int32),
        encoder_output_lengths=np.array([[150]], np.int32),
        decoder_input_ids=np.array([[*PROMPTS[2], 0, 0]], np.int32),
        decoder_input_lengths=np.array([[3]], np.int32),
    )
    parsed = parse(inputs)
    assert parsed.input_ids == [PROMPTS[2]]
    assert parsed.encoder_features[0].shape == (300, 80) and parsed.encoder_features[0].dtype == np.float32
    assert parse(contract_inputs(encoder_output_lengths=None)).encoder_features[0].shape == (3000, 80)


def test_parse_reads_several_rows_in_a_decoupled_model():
    inputs = contract_inputs(
        frames=10,
        encoder_input_features=np.zeros((2, 10, 80), np.float16),
        input_lengths=np.array([[10], [6]], np.int32),
        encoder_output_lengths=np.array([[5], [3]], np.int32),
        decoder_input_ids=np.array([PROMPTS[0], PROMPTS[0]], np.int32),
    )
    parsed = parse(inputs, decoupled=True)
    assert [len(features) for features in parsed.encoder_features] == [10, 6]
    with pytest.raises(ValueError, match="decoder_input_ids with 2 prompts needs a decoupled model"):
        parse(inputs)


@pytest.mark.parametrize(
    ("extra", "encoder_decoder", "message"),
    [
        (
            {"encoder_output_lengths": np.array([[1499]], np.int32)},
            True,
            r"encoder_output_lengths \[1499\] must be input_lengths // 2 \(\[1500\]\)",
        ),
        ({"input_lengths": np.array([[3001]], np.int32)}, True, r"input_lengths \[3001\] do not fit encoder_input_fea"),
        ({"input_ids": np.array([[1, 2]], np.int32)}, True, "input_ids: an encoder-decoder request takes its decoder"),
        ({"decoder_input_ids": None}, True, "decoder_input_ids missing"),
        (
            {"decoder_input_lengths": np.array([[9]], np.int32)},
            True,
            r"decoder_input_lengths \[9\] do not fit decoder_input_ids",
        ),
        ({"encoder_input_features": np.zeros((80,), np.float16)}, True, r"of shape \[80\]: send \[1, frames, n_mels\]"),
        ({}, False, "encoder_input_features: this is a decoder-only model"),
        (
            {"encoder_input_features": None, "input_ids": np.array([[1, 2]], np.int32)},
            True,
            "encoder_input_features missing: this is an encoder-decoder model",
        ),
    ],
)
def test_parse_refusals(extra, encoder_decoder, message):
    with pytest.raises(ValueError, match=message):
        parse(contract_inputs(**extra), encoder_decoder=encoder_decoder)


def test_the_encoder_decoder_inputs_keep_the_decoder_only_ones():
    tensors = {tensor.name: tensor for tensor in encoder_decoder_inputs("TYPE_FP32")}
    assert tensors["input_ids"].optional and tensors["encoder_input_features"].data_type == "TYPE_FP32"
    assert tensors["encoder_input_features"].dims == (-1, -1) and tensors["encoder_input_features"].ragged
    assert tensors["decoder_input_ids"].ragged and not tensors["input_lengths"].optional
    assert {"encoder_output_lengths", "decoder_input_lengths", "end_id", "streaming"} <= set(tensors)


# --- the engine's build-time side -------------------------------------------------------------------------------


def whisper_context(
    tmp_path, *, precision="bf16", max_input_len=32, max_output_len=96, encoder_decoder=True, gpu="H100", llm_dir=None
):
    if llm_dir is None:
        llm_dir = tmp_path / "whisper"
        llm_dir.mkdir(exist_ok=True)
        config = {"architectures": ["WhisperForConditionalGeneration"], "max_target_positions": 448}
        (llm_dir / "config.json").write_text(json.dumps(config))
    point = BuildPoint(
        model="whisper",
        engine="torch",
        precision=precision,
        max_batch_size=16,
        mode="offline",
        gpu=gpu,
        max_input_len=max_input_len,
        max_output_len=max_output_len,
    )
    engine = TorchEngine()
    deployment = tmp_path / "deployment"
    ctx = BuildContext(
        point=point,
        deployment_dir=deployment,
        checkpoint_dir=llm_dir,
        llm_dir=llm_dir,
        engine_dir=deployment / "engines",
        model_repo_dir=deployment / "model_repo",
        encoder_decoder=encoder_decoder,
    )
    return replace(ctx, encoder_features_dtype=engine.encoder_features_dtype(ctx))


def test_validate_bounds_max_seq_len_by_the_decoder_positions(tmp_path):
    TorchEngine().validate(whisper_context(tmp_path, max_input_len=48, max_output_len=400))
    with pytest.raises(UsageError, match=r"max_seq_len 449 exceeds .* lower --max-input-len/--max-output-len to sum"):
        TorchEngine().validate(whisper_context(tmp_path, max_input_len=49, max_output_len=400))
    assert unsupported_reason({"architectures": ["WhisperForConditionalGeneration"]}, 448) is None


def test_validate_refuses_a_checkpoint_of_the_other_kind(tmp_path):
    with pytest.raises(UsageError, match="needs a decoder-only checkpoint, and it holds a WhisperForConditionalGen"):
        TorchEngine().validate(whisper_context(tmp_path, encoder_decoder=False))


@pytest.mark.parametrize(("precision", "features_type"), [("fp32", "TYPE_FP32"), ("bf16", "TYPE_FP16")])
def test_config_declares_the_encoder_decoder_inputs(tmp_path, precision, features_type):
    ctx = whisper_context(tmp_path, precision=precision)
    assert ctx.encoder_features_dtype == features_type
    engine = TorchEngine()
    variables = {"ctx": ctx, "engine": engine.template_context(ctx)}
    configs = render_repository([TemplateSource(engine.templates_dir, ("tensorrt_llm",), variables)], tmp_path / "r")
    config = validate_config(configs["tensorrt_llm"], expected_name="tensorrt_llm")
    inputs = {tensor.name: tensor for tensor in config.input}
    features = inputs["encoder_input_features"]
    assert model_config_pb2.DataType.Name(features.data_type) == features_type and list(features.dims) == [-1, -1]
    assert features.allow_ragged_batch and features.optional
    assert inputs["input_ids"].optional and not inputs["input_lengths"].optional
    assert list(inputs["decoder_input_ids"].dims) == [-1] and inputs["decoder_input_ids"].allow_ragged_batch
    assert inputs["encoder_output_lengths"].optional and inputs["decoder_input_lengths"].optional
    params = {key: value.string_value for key, value in config.parameters.items()}
    assert params["encoder_decoder"] == "true" and params["max_seq_len"] == "128"


def test_padded_prefill_gives_the_same_tokens(generator, hf_whisper, clips, monkeypatch):
    """The padded prefill that CUDA graphs replay, run eagerly: its padding rows go to the scratch slot."""
    monkeypatch.setattr(generator.model, "pad_prefill", True)
    cases = list(zip(clips, PROMPTS, strict=True))
    sinks = run_all(generator, [request(features, prompt) for features, prompt in cases])
    assert [sink.tokens for sink in sinks] == [hf_generate(hf_whisper, *case) for case in cases]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="admission beside decode steps needs a GPU")
def test_admission_beside_decode_steps_keeps_every_requests_tokens(whisper_dir, hf_whisper, clips):
    """On a GPU, requests arriving while others decode are encoded and prefilled on their own stream: each gets
    transformers' tokens, and steps ran while admissions were in flight."""
    gen = load_generator(whisper_dir, device="cuda", max_slots=8, max_input_len=16, max_seq_len=64)
    try:
        assert gen.model.overlap_admission and gen.model.use_graphs
        assert sorted(gen.model._encoder_graphs) == list(range(1, 9))  # every encoder batch size, captured at load
        cases = [(clips[i % 3], PROMPTS[i % 3]) for i in range(12)]
        expected = {i: hf_generate(hf_whisper, *cases[i]) for i in range(3)}
        sinks = []
        for index, (features, prompt) in enumerate(cases):
            sink = RecordingSink()
            gen.submit(request(features, prompt, new_tokens=NEW_TOKENS + index), sink)
            sinks.append(sink)
            time.sleep(0.002 * (index % 4))  # arrivals spread over the first requests' decode steps
        for sink in sinks:
            sink.wait()
        assert [sink.error for sink in sinks] == [None] * len(cases)
        for index, sink in enumerate(sinks):
            assert sink.tokens[:NEW_TOKENS] == expected[index % 3]
            assert len(sink.tokens) == NEW_TOKENS + index
        assert gen.steps_beside_admission > 0
        # a penalised request admitted beside decode steps counts only its own tokens
        penalised = request(clips[1], PROMPTS[1], sampling=SamplingParams(top_k=1, repetition_penalty=3.0))
        alone = run_all(gen, [penalised])[0].tokens
        assert alone != expected[1]
        running = RecordingSink()
        gen.submit(request(clips[0], PROMPTS[0], new_tokens=60, streaming=True), running)
        while not running.streamed:
            time.sleep(0.001)
        assert run_all(gen, [penalised])[0].tokens == alone
        running.wait()
    finally:
        gen.close()


@pytest.mark.server
def test_the_triton_model_answers_whisper_bls_requests(tmp_path, whisper_dir, hf_whisper, clips):
    """The rendered tensorrt_llm model on the bundled tritonserver, asked as TensorRT-LLM's whisper_bls asks it."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    from trtdeploy.server import launch

    ctx = whisper_context(tmp_path, precision="fp32", gpu="cpu", llm_dir=whisper_dir)
    engine = TorchEngine()
    engine.validate(ctx)
    variables = {"ctx": ctx, "engine": engine.template_context(ctx)}
    render_repository([TemplateSource(engine.templates_dir, ("tensorrt_llm",), variables)], tmp_path / "repo")

    def infer(client, **inputs):
        tensors = []
        for name, value in inputs.items():
            tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            tensors.append(tensor)
        return client.infer("tensorrt_llm", tensors)

    with launch(tmp_path / "repo", timeout=120) as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        answers = {}
        for frames in (3000, 400):
            features = clips[0][:frames]
            sent = contract_inputs(
                frames=frames, dtype=np.float32, request_output_len=np.array([[NEW_TOKENS]], np.int32)
            )
            sent["encoder_input_features"] = features[None]
            sent["end_id"] = sent["pad_id"] = np.array([[-1]], np.int32)
            result = infer(client, **sent)
            answers[frames] = result.as_numpy("output_ids").reshape(-1).tolist()
            assert result.as_numpy("sequence_length").reshape(-1).tolist() == [NEW_TOKENS]
        with pytest.raises(Exception, match="encoder_input_features missing: this is an encoder-decoder model"):
            infer(
                client,
                input_ids=np.array([[1, 2]], np.int32),
                input_lengths=np.array([[2]], np.int32),
                request_output_len=np.array([[4]], np.int32),
            )
    assert answers[3000] == hf_generate(hf_whisper, clips[0], PROMPTS[0])
    assert answers[400] == masked_reference(hf_whisper, clips[0][:400], PROMPTS[0])


def test_scaled_decoder_embeddings_are_refused_by_name():
    config = {"architectures": ["WhisperForConditionalGeneration"], "scale_embedding": True}
    assert "scale_embedding" in unsupported_reason(config, 448)
