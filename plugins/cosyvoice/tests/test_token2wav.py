"""The whole token2wav loaded from a tiny random checkpoint in the official layout (``cosyvoice{2,3}.yaml``,
``flow.pt``, ``hift.pt``): the yaml read back into the configs it was written from, batches against single requests,
streaming call sequences against offline audio, the stream cache as arrays, and the refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from trtdeploy_cosyvoice.checkpoint import TINY_LLM, tiny_token2wav_config, token2wav_yaml
from trtdeploy_cosyvoice.model_yaml import read_model_yaml
from trtdeploy_cosyvoice.token2wav.conv_kernels import encoder_kernels, vocoder_kernels
from trtdeploy_cosyvoice.token2wav.flow import CosyVoice2Flow, CosyVoice3Flow
from trtdeploy_cosyvoice.token2wav.hift import CausalHiFTGenerator, HiFTGenerator, StreamCache
from trtdeploy_cosyvoice.token2wav.model import FlowJob, Token2Wav, Token2WavConfig

from trtdeploy.errors import UsageError

GENERATIONS = ("cosyvoice2", "cosyvoice3")
SAMPLES_PER_FRAME = 480
#: The official Triton BLS's streaming calls for a 70-token answer: (tokens sent, token_offset, finalize); a call
#: that is not final sends 3 tokens it only reads ahead.
STREAM_CALLS = ((18, 0, False), (43, 15, False), (70, 40, True))
#: The most a streamed answer's audio may differ from the offline audio of the same tokens, relative to that audio
#: (root mean square): measured values are in the tests that use it.
STREAM_CLOSENESS = 0.4


@pytest.fixture(scope="module")
def token2wav(cosyvoice_checkpoint):
    """``token2wav(generation)``: the tiny checkpoint's Token2Wav (flow in float32 on the CPU)."""
    loaded = {}

    def load(generation: str) -> Token2Wav:
        if generation not in loaded:
            loaded[generation] = Token2Wav.load(cosyvoice_checkpoint(generation), generation)
        return loaded[generation]

    return load


def request(seed: int, prompt_tokens: int = 20, tokens: int = 70) -> FlowJob:
    rng = np.random.default_rng(seed)
    return FlowJob(
        tokens=rng.integers(0, 6561, tokens),
        prompt_tokens=rng.integers(0, 6561, prompt_tokens),
        prompt_mel=(rng.standard_normal((2 * prompt_tokens, 80)) * 2 - 5).astype(np.float32),
        embedding=rng.standard_normal(192).astype(np.float32),
    )


def cut(job: FlowJob, end: int, offset: int) -> FlowJob:
    return FlowJob(job.tokens[:end], job.prompt_tokens, job.prompt_mel, job.embedding, offset)


def copy_checkpoint(source: Path, dest: Path, generation: str) -> Path:
    """The token2wav files of a checkpoint, in a folder a test may change."""
    dest.mkdir()
    for name in (f"{generation}.yaml", "flow.pt", "hift.pt"):
        shutil.copy(source / name, dest / name)
    return dest


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))


# -- the yaml ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_written_yaml_reads_back_into_its_configs(cosyvoice_checkpoint, generation):
    path = cosyvoice_checkpoint(generation) / f"{generation}.yaml"
    assert Token2WavConfig.from_yaml(path, generation) == tiny_token2wav_config(generation)
    document = read_model_yaml(path)
    # what the LLM's conversion and the front end read stays
    assert document["llm_input_size"] == document["llm_output_size"] == TINY_LLM.hidden_size
    assert (document["sample_rate"], document["spk_embed_dim"], document["speech_token_size"]) == (24000, 192, 6561)
    assert (document["token_frame_rate"], document["token_mel_ratio"]) == (25, 2)
    assert document["feat_extractor"]["fmax"] == (8000 if generation == "cosyvoice2" else None)
    assert document["flow"]["decoder"]["estimator"]["static_chunk_size"] == 50


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_released_sizes_round_trip_through_the_official_format(tmp_path, generation):
    released = Token2WavConfig.released(generation)
    path = tmp_path / f"{generation}.yaml"
    path.write_text(token2wav_yaml(released, llm_size=896))
    assert Token2WavConfig.from_yaml(path, generation) == released
    assert "num_up_blocks" not in path.read_text()  # an argument upstream's encoder does not take


# -- loading -------------------------------------------------------------------------------------------------------


def test_both_generations_load_with_their_modules(token2wav):
    v2, v3 = token2wav("cosyvoice2"), token2wav("cosyvoice3")
    assert (v2.generation, v3.generation, v2.sample_rate) == ("cosyvoice2", "cosyvoice3", 24000)
    assert isinstance(v2.flow, CosyVoice2Flow) and isinstance(v2.vocoder, HiFTGenerator)
    assert isinstance(v3.flow, CosyVoice3Flow) and isinstance(v3.vocoder, CausalHiFTGenerator)
    for model in (v2, v3):
        assert not model.flow.training and not model.vocoder.training
        assert not any("parametrizations" in name for name in model.vocoder.state_dict())  # weight norm folded


def test_the_flow_takes_the_dtype_and_the_vocoder_keeps_its_own(cosyvoice_checkpoint):
    model = Token2Wav.load(cosyvoice_checkpoint("cosyvoice3"), "cosyvoice3", dtype=torch.bfloat16)
    assert {parameter.dtype for parameter in model.flow.parameters()} == {torch.bfloat16}
    assert {parameter.dtype for parameter in model.vocoder.f0_predictor.parameters()} == {torch.float64}
    others = {parameter.dtype for name, parameter in model.vocoder.named_parameters() if "f0_predictor" not in name}
    assert others == {torch.float32}
    [mel] = model.mels([request(0, tokens=20)], streaming=False, finalize=True)
    assert mel.dtype == np.float32 and mel.shape == (80, 40) and np.isfinite(mel).all()


# -- the flow ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize(("streaming", "finalize"), [(False, True), (True, False), (True, True)])
def test_a_batch_gives_each_job_its_own_mel(cosyvoice_checkpoint, generation, streaming, finalize):
    model = Token2Wav.load(cosyvoice_checkpoint(generation), generation, max_batch=2)  # 3 jobs: two batches
    jobs = [cut(request(1, 20, 70), 43, 15), request(2, 9, 31), cut(request(3, 33, 50), 50, 4)]
    together = model.mels(jobs, streaming=streaming, finalize=finalize)
    lookahead = 0 if finalize else 3
    for job, mel in zip(jobs, together, strict=True):
        [alone] = model.mels([job], streaming=streaming, finalize=finalize)
        assert mel.shape == (80, 2 * (len(job.tokens) - lookahead - job.token_offset))
        np.testing.assert_allclose(mel, alone, atol=2e-5, rtol=0)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_token_offset_returns_the_frames_from_twice_the_offset(token2wav, generation):
    model, job = token2wav(generation), request(4, tokens=40)
    [whole, tail] = model.mels([job, cut(job, 40, 12)], streaming=True, finalize=True)
    assert tail.shape == (80, 2 * (40 - 12))
    np.testing.assert_array_equal(tail, whole[:, 24:])


# -- CosyVoice2's vocoder ------------------------------------------------------------------------------------------


def test_v2_offline_audio_has_480_samples_a_frame_and_a_seed_repeats_it(token2wav):
    model = token2wav("cosyvoice2")
    [mel] = model.mels([request(5, tokens=30)], streaming=False, finalize=True)
    (first, cache), (again, _), (other, _), (fresh, _), (fresh_again, _) = model.speech(
        [mel] * 5, [None] * 5, finalize=True, seeds=[7, 7, 8, None, None]
    )
    assert cache is None and first.dtype == np.float32 and first.shape == (SAMPLES_PER_FRAME * 60,)
    assert np.isfinite(first).all() and rms(first) > 1e-3
    np.testing.assert_array_equal(again, first)
    for different in (other, fresh, fresh_again):
        assert np.abs(different - first).max() > 1e-3
    assert np.abs(fresh - fresh_again).max() > 1e-3  # no seed: fresh noise, as upstream


def stream_v2(model: Token2Wav, job: FlowJob, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One request streamed as the official BLS calls token2wav; returns the new mel and the audio of each call."""
    mels, pieces, cache = [], [], None
    for call, (end, offset, finalize) in enumerate(STREAM_CALLS):
        [mel] = model.mels([cut(job, end, offset)], streaming=not finalize, finalize=finalize)
        [(speech, cache)] = model.speech([mel], [cache], finalize=finalize, seeds=[seed + call])
        assert (cache is None) == finalize
        mels.append(mel)
        pieces.append(speech)
    return mels, pieces


@pytest.mark.parametrize("seed", [0, 1])
def test_v2_streamed_chunks_join_to_the_offline_length_and_stay_close(token2wav, seed):
    model, job = token2wav("cosyvoice2"), request(10 + seed)
    mels, pieces = stream_v2(model, job, seed=100)
    # 15 and 25 tokens (30 and 50 frames), the first call holding back 3840 samples; then the rest with them
    assert [len(piece) for piece in pieces] == [30 * 480 - 3840, 50 * 480, 60 * 480 + 3840]
    [offline_mel] = model.mels([job], streaming=False, finalize=True)
    [(offline, _)] = model.speech([offline_mel], [None], finalize=True, seeds=[100])
    streamed = np.concatenate(pieces)
    assert streamed.shape == offline.shape == (2 * 70 * SAMPLES_PER_FRAME,)
    # rms(streamed - offline) / rms(offline) measured 0.14-0.17 over 40 requests on this checkpoint (0.05 on one of
    # another seed): the chunked mel is up to 3 off the offline mel, and every call draws its own noise. Audio shifted
    # by a chunk, repeated or left out would be unrelated: about 1.4.
    assert rms(streamed - offline) < STREAM_CLOSENESS * rms(offline)


def test_v2_the_cache_travels_as_arrays(token2wav):
    model, job = token2wav("cosyvoice2"), request(12)
    [first, second] = model.mels([cut(job, 18, 0), cut(job, 43, 15)], streaming=True, finalize=False)
    [(_, cache)] = model.speech([first], [None], finalize=False, seeds=[1])
    arrays = cache.to_arrays()
    assert [(array.shape, array.dtype) for array in arrays] == [((80, 8), np.float32), ((3840,), np.float32)] + [
        ((3840,), np.float32)
    ]
    [(direct, _)] = model.speech([second], [cache], finalize=False, seeds=[2])
    [(travelled, _)] = model.speech([second], [StreamCache.from_arrays(*arrays)], finalize=False, seeds=[2])
    np.testing.assert_array_equal(travelled, direct)
    with pytest.raises(ValueError, match="send back the cache"):
        StreamCache.from_arrays(arrays[0][:, :7], arrays[1], arrays[2])


def test_v2_a_batch_of_stream_calls_gives_each_its_own_audio(token2wav):
    """A request starting, one going on and one finishing vocoded together, against each alone."""
    model = token2wav("cosyvoice2")
    going, finishing = request(13), request(14)
    firsts = [cut(going, 18, 0), cut(finishing, 18, 0)]
    [going_first, finishing_first] = model.mels(firsts, streaming=True, finalize=False)
    [(_, going_cache)] = model.speech([going_first], [None], finalize=False, seeds=[1])
    [(_, finishing_cache)] = model.speech([finishing_first], [None], finalize=False, seeds=[2])
    [starting] = model.mels([cut(request(15), 18, 0)], streaming=True, finalize=False)
    [going_next] = model.mels([cut(going, 43, 15)], streaming=True, finalize=False)
    [finishing_last] = model.mels([cut(finishing, 70, 15)], streaming=False, finalize=True)
    calls = [
        (starting, None, 3, False),
        (going_next, going_cache, 4, False),
        (finishing_last, finishing_cache, 5, True),
    ]
    for finalize in (False, True):
        group = [call for call in calls if call[3] == finalize]
        together = model.speech(
            [call[0] for call in group], [call[1] for call in group], finalize=finalize, seeds=[c[2] for c in group]
        )
        for (mel, cache, seed, _), (speech, new_cache) in zip(group, together, strict=True):
            [(alone, alone_cache)] = model.speech([mel], [cache], finalize=finalize, seeds=[seed])
            # float32 convolutions round differently at another batch size
            np.testing.assert_allclose(speech, alone, atol=1e-4, rtol=0)
            assert (new_cache is None) == (alone_cache is None) == finalize


# -- CosyVoice3's vocoder ------------------------------------------------------------------------------------------


def test_v3_audio_before_the_end_is_a_prefix_of_the_finalized_audio(token2wav):
    model = token2wav("cosyvoice3")
    [mel] = model.mels([request(20, tokens=30)], streaming=False, finalize=True)
    [whole] = model.causal_speech([mel], finalize=True)
    assert whole.shape == (60 * SAMPLES_PER_FRAME,) and rms(whole) > 1e-3
    prefixes = model.causal_speech([mel[:, :frames] for frames in (8, 9, 33, 60)], finalize=False)
    for frames, prefix in zip((8, 9, 33, 60), prefixes, strict=True):
        assert prefix.shape == ((frames - 8) * SAMPLES_PER_FRAME,)
        np.testing.assert_allclose(prefix, whole[: len(prefix)], atol=1e-6, rtol=0)


def test_v3_streamed_audio_is_the_vocoded_stream_and_stays_close_to_offline(token2wav):
    model, job = token2wav("cosyvoice3"), request(21)
    mel_so_far, pieces = np.zeros((80, 0), np.float32), []
    for end, offset, finalize in STREAM_CALLS:
        [mel] = model.mels([cut(job, end, offset)], streaming=not finalize, finalize=finalize)
        mel_so_far = np.concatenate([mel_so_far, mel], axis=1)
        [speech] = model.causal_speech([mel_so_far], finalize=finalize)
        pieces.append(speech[sum(len(piece) for piece in pieces) :])
    assert [len(piece) for piece in pieces] == [(30 - 8) * 480, 50 * 480, (60 + 8) * 480]
    streamed = np.concatenate(pieces)
    np.testing.assert_allclose(streamed, model.causal_speech([mel_so_far], finalize=True)[0], atol=1e-6, rtol=0)
    [offline_mel] = model.mels([job], streaming=False, finalize=True)
    [offline] = model.causal_speech([offline_mel], finalize=True)
    assert streamed.shape == offline.shape
    # measured 0.10-0.16 over 40 requests on this checkpoint (0.22-0.29 on one of another seed): the chunked mel is
    # up to 0.16 off the offline one, which shifts the excitation's phase (F0 integrated over time)
    assert rms(streamed - offline) < STREAM_CLOSENESS * rms(offline)


# -- refusals ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda job: FlowJob(np.array([5, 6561]), job.prompt_tokens, job.prompt_mel, job.embedding), "token 6561"),
        (lambda job: FlowJob(job.tokens, np.array([-1, 2]), job.prompt_mel[:4], job.embedding), "token -1"),
        (lambda job: FlowJob(job.tokens, job.prompt_tokens, job.prompt_mel[:-1], job.embedding), "match_prompt_length"),
        (lambda job: FlowJob(job.tokens, job.prompt_tokens, job.prompt_mel, job.embedding[:80]), "embedding"),
        (lambda job: FlowJob(job.tokens, job.prompt_tokens, job.prompt_mel, job.embedding, 71), "token_offset 71"),
    ],
)
def test_bad_flow_input_is_refused_naming_it(token2wav, change, message):
    with pytest.raises(ValueError, match=message):
        token2wav("cosyvoice2").mels([request(30), change(request(31))], streaming=False, finalize=True)


def test_a_vocoder_call_that_does_not_fit_is_refused(token2wav):
    v2, v3 = token2wav("cosyvoice2"), token2wav("cosyvoice3")
    mel = np.zeros((80, 7), np.float32)
    with pytest.raises(ValueError, match="too few"):
        v2.speech([mel], [None], finalize=False)
    with pytest.raises(ValueError, match="too short"):
        v3.causal_speech([mel], finalize=False)
    with pytest.raises(ValueError, match=r"not \[80, frames\]"):
        v3.causal_speech([mel.T], finalize=True)
    with pytest.raises(UsageError, match="cosyvoice2's vocoder") as refused:
        v3.speech([mel], [None], finalize=True)
    assert "causal_speech" in refused.value.hint


def test_unreadable_or_missing_weights_are_named(cosyvoice_checkpoint, tmp_path):
    folder = copy_checkpoint(cosyvoice_checkpoint("cosyvoice2"), tmp_path / "checkpoint", "cosyvoice2")
    (folder / "flow.pt").write_bytes(b"not a torch file")
    with pytest.raises(UsageError, match=r"cannot read .*flow\.pt"):
        Token2Wav.load(folder, "cosyvoice2")
    (folder / "flow.pt").unlink()
    with pytest.raises(UsageError, match=r"flow\.pt is missing"):
        Token2Wav.load(folder, "cosyvoice2")


def test_weights_that_do_not_match_name_the_file_and_keys(cosyvoice_checkpoint, tmp_path):
    source = cosyvoice_checkpoint("cosyvoice3")
    folder = copy_checkpoint(source, tmp_path / "checkpoint", "cosyvoice3")
    state = torch.load(source / "flow.pt", weights_only=True)
    state["decoder.estimator.extra.weight"] = state.pop("spk_embed_affine_layer.bias")
    torch.save(state, folder / "flow.pt")
    with pytest.raises(UsageError, match=r"flow\.pt lacks spk_embed_affine_layer\.bias and has unexpected decoder"):
        Token2Wav.load(folder, "cosyvoice3")
    state = torch.load(source / "flow.pt", weights_only=True)
    state["input_embedding.weight"] = state["input_embedding.weight"][:, :40]
    torch.save(state, folder / "flow.pt")
    with pytest.raises(UsageError, match=r"flow\.pt does not fit the yaml's sizes: .*input_embedding"):
        Token2Wav.load(folder, "cosyvoice3")


def test_hift_keys_with_the_gan_trainers_prefix_load(cosyvoice_checkpoint, tmp_path, token2wav):
    source = cosyvoice_checkpoint("cosyvoice2")
    folder = copy_checkpoint(source, tmp_path / "checkpoint", "cosyvoice2")
    state = torch.load(source / "hift.pt", weights_only=True)
    torch.save({f"generator.{key}": value for key, value in state.items()}, folder / "hift.pt")
    mel = np.random.default_rng(0).standard_normal((80, 20)).astype(np.float32)
    [(expected, _)] = token2wav("cosyvoice2").speech([mel], [None], finalize=True, seeds=[3])
    [(speech, _)] = Token2Wav.load(folder, "cosyvoice2").speech([mel], [None], finalize=True, seeds=[3])
    np.testing.assert_array_equal(speech, expected)


@pytest.mark.parametrize(
    ("generation", "old", "new", "message"),
    [
        ("cosyvoice2", "generator.HiFTGenerator", "generator.CausalHiFTGenerator", "hift builds .*CausalHiFTGenerator"),
        ("cosyvoice3", "dit.DiT", "decoder.CausalConditionalDecoder", "estimator builds"),
        ("cosyvoice2", "use_cnn_module: False", "use_cnn_module: True", "use_cnn_module is True"),
        (
            "cosyvoice2",
            "        macaron_style: False\n",
            "",
            "macaron_style is not given, and upstream's default is True",
        ),
        ("cosyvoice2", "pos_enc_layer_type: 'rel_pos_espnet'", "pos_enc_layer_type: 'abs_pos'", "pos_enc_layer_type"),
        ("cosyvoice2", "input_layer: 'linear'", "input_layer: 'conv2d'", "input_layer"),
        ("cosyvoice3", "            depth: 2\n", "", "estimator has no depth"),
        ("cosyvoice3", "ff_mult: 2", "ff_mult: 2\n            qk_norm: True", "qk_norm is an argument"),
        ("cosyvoice3", "t_scheduler: 'cosine'", "t_scheduler: 'linear'", "t_scheduler"),
    ],
)
def test_a_yaml_that_builds_another_network_is_refused_naming_the_key(
    cosyvoice_checkpoint, tmp_path, generation, old, new, message
):
    folder = copy_checkpoint(cosyvoice_checkpoint(generation), tmp_path / "checkpoint", generation)
    path = folder / f"{generation}.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(UsageError, match=message) as refused:
        Token2Wav.load(folder, generation)
    assert str(path) in refused.value.message


def test_settings_that_do_not_shape_inference_are_ignored(cosyvoice_checkpoint, tmp_path):
    folder = copy_checkpoint(cosyvoice_checkpoint("cosyvoice2"), tmp_path / "checkpoint", "cosyvoice2")
    path = folder / "cosyvoice2.yaml"
    text = path.read_text().replace("dropout_rate: 0.1", "dropout_rate: 0.3").replace("only_mask_loss: True", "")
    path.write_text(text.replace("training_cfg_rate: 0.2", "training_cfg_rate: 0.5"))
    assert Token2Wav.load(folder, "cosyvoice2").config == tiny_token2wav_config("cosyvoice2")


def test_a_server_may_load_only_the_part_it_runs(cosyvoice_checkpoint):
    vocoder_only = Token2Wav.load(cosyvoice_checkpoint("cosyvoice3"), "cosyvoice3", parts=["vocoder"])
    whole = Token2Wav.load(cosyvoice_checkpoint("cosyvoice3"), "cosyvoice3")
    mel = np.random.default_rng(0).standard_normal((80, 20)).astype(np.float32) - 5.0
    np.testing.assert_array_equal(
        vocoder_only.causal_speech([mel], finalize=True)[0], whole.causal_speech([mel], finalize=True)[0]
    )
    with pytest.raises(UsageError, match="loaded without its flow"):
        vocoder_only.mels([request(0)], streaming=False, finalize=True)
    with pytest.raises(UsageError, match="are not some of"):
        Token2Wav.load(cosyvoice_checkpoint("cosyvoice3"), "cosyvoice3", parts=["encoder"])


def test_pytorch_kernels_run_single_rows_of_lengths_of_their_own_and_cudnn_the_rest():
    def cudnn_on(kernels) -> bool:
        with kernels:
            return torch.backends.cudnn.enabled

    assert torch.backends.cudnn.enabled
    assert not cudnn_on(encoder_kernels(rows=1))
    assert cudnn_on(encoder_kernels(rows=3))  # PyTorch's kernels would loop over the rows
    assert not cudnn_on(vocoder_kernels(1, finalize=True))  # offline, or a stream's last chunk
    assert cudnn_on(vocoder_kernels(1, finalize=False))  # a streamed chunk: its shape repeats
    assert cudnn_on(vocoder_kernels(2, finalize=True))
    assert torch.backends.cudnn.enabled  # restored after each call
