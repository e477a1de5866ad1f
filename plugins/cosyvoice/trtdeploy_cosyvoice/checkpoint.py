"""Random-weight CosyVoice checkpoints in the official layout, for tests and benchmarks.

So far: ``cosyvoice{2,3}.yaml`` (its top-level sizes), ``llm.pt`` (the Qwen2 weights under ``llm.model.`` with
the generation's speech table, head and, for CosyVoice2, sos/task_id table), ``CosyVoice-BlankEN/`` (a Qwen2
config, tokenizer and weights of its own, as published), ``campplus.onnx`` (a small speaker encoder with CAM++'s
interface: fbank frames ``[1, T, 80]`` in, statistics pooled over time, a 192-d embedding out), the speech
tokenizer (``speech_tokenizer_v2.onnx`` or ``speech_tokenizer_v3.onnx``, full size, as s3tokenizer reads it), and the
token2wav: ``flow.pt`` and ``hift.pt`` with the yaml's ``flow`` and ``hift`` sections. The LLM and token2wav are tiny
or at the released sizes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trtdeploy import QWEN2_0_5B, TinyShape, write_random_causal_lm

from .convert import BLANK_LLM, LLM_WEIGHTS
from .generations import GENERATIONS, SPEECH_TOKENIZER_FILES, SPEECH_TOKENS, GenerationName
from .speaker import CAMPPLUS, EMBEDDING_DIM, MEL_BINS

if TYPE_CHECKING:
    from .token2wav.model import Token2WavConfig

#: Room for the tiny tokenizer (400 tokens) and CosyVoice3's 278 added specials.
TINY_LLM = TinyShape(vocab_size=768)
#: Tokens of the released CosyVoice-BlankEN tokenizer (Qwen2's 151,643 and 3 specials): the speech tokens of the
#: converted LLM start at 151,663 (CosyVoice2) and 151,924 (CosyVoice3), as in the official conversions.
BLANK_TOKENIZER_SIZE = 151646


def write_random_checkpoint(
    dest: Path, generation: GenerationName, *, size: Literal["tiny", "full"] = "tiny", stops: bool = True, seed: int = 0
) -> None:
    """The whole checkpoint (its speech tokenizer at full size: several hundred MB). ``size="full"`` makes the LLM
    and token2wav the released sizes (the speaker encoder stays small); ``stops=False``, see :func:`write_random_llm`.
    """
    write_random_llm(dest, generation, full_size=size == "full", stops=stops, seed=seed)
    _write_speaker_encoder(dest / CAMPPLUS, seed)
    write_random_speech_tokenizer(dest / SPEECH_TOKENIZER_FILES[generation], generation, seed=seed + 3)
    write_random_token2wav(dest, generation, full_size=size == "full", seed=seed + 4)


def write_random_llm(
    dest: Path, generation: GenerationName, *, full_size: bool = False, stops: bool = True, seed: int = 0
) -> None:
    """The yaml, ``llm.pt`` and ``CosyVoice-BlankEN/``: what the LLM's conversion reads. ``full_size``: Qwen2-0.5B
    in bfloat16 with a tokenizer of BlankEN's size (most of its text tokens fillers), so the converted LLM has the
    released vocabulary and head.

    ``stops=False`` zeroes the head's rows of the stop tokens: their logit is 0 while the speech tokens' are random,
    so a zero logit is never among the 50 highest of 6,561 (top-k, 50 by default) and each request makes exactly its
    token cap of speech, which benchmarks of a given output length need.
    """
    import torch
    import transformers

    spec = GENERATIONS[generation]
    blank = dest / BLANK_LLM
    write_random_causal_lm(
        blank,
        shape=QWEN2_0_5B if full_size else TINY_LLM,
        seed=seed,
        max_position_embeddings=32768,
        dtype="bfloat16" if full_size else "float32",
        text_tokens=BLANK_TOKENIZER_SIZE if full_size else None,
    )
    config = transformers.AutoConfig.from_pretrained(str(blank), local_files_only=True)
    dtype = torch.bfloat16 if full_size else torch.float32
    torch.manual_seed(seed + 1)  # llm.pt holds the trained LLM, not BlankEN's weights
    qwen = transformers.Qwen2ForCausalLM(config).to(dtype)
    hidden = config.hidden_size
    state = {f"llm.model.{key}": value.detach().clone() for key, value in qwen.state_dict().items()}
    state["speech_embedding.weight"] = (torch.randn(spec.speech_rows, hidden) * 0.5).to(dtype)
    decoder = torch.nn.Linear(hidden, spec.speech_rows, bias=spec.sos_row is None).to(dtype)
    if not stops:
        with torch.no_grad():
            decoder.weight[list(spec.stop_rows)] = 0
            if decoder.bias is not None:
                decoder.bias[list(spec.stop_rows)] = 0
    state.update({f"llm_decoder.{key}": value.detach().clone() for key, value in decoder.state_dict().items()})
    if spec.sos_row is None:
        state["llm_embedding.weight"] = (torch.randn(2, hidden) * 0.5).to(dtype)
    torch.save(state, dest / LLM_WEIGHTS)
    (dest / f"{generation}.yaml").write_text(
        f"sample_rate: 24000\nllm_input_size: {hidden}\nllm_output_size: {hidden}\nspk_embed_dim: {EMBEDDING_DIM}\n"
        f"speech_token_size: {SPEECH_TOKENS}\ntoken_frame_rate: 25\ntoken_mel_ratio: 2\n"
    )


def _write_speaker_encoder(path: Path, seed: int) -> None:
    """A convolution over the fbank frames, mean and standard deviation over time, a projection to 192."""
    import torch

    class SpeakerEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(MEL_BINS, 32, kernel_size=3, padding=1)
            self.project = torch.nn.Linear(64, EMBEDDING_DIM)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            hidden = torch.relu(self.conv(features.transpose(1, 2)))
            return self.project(torch.cat([hidden.mean(-1), hidden.std(-1)], -1))

    torch.manual_seed(seed + 2)
    torch.onnx.export(
        SpeakerEncoder().eval(), (torch.randn(1, 50, MEL_BINS),), str(path), input_names=["input"],
        output_names=["output"], dynamic_axes={"input": {1: "frames"}}, dynamo=False,
    )  # fmt: skip


#: Weights CosyVoice2's export left anonymous, under the names s3tokenizer's converter looks for.
_V2_ANONYMOUS_WEIGHTS = {
    "encoder.conv1.weight": "onnx::Conv_2216",
    "encoder.conv1.bias": "onnx::Conv_2217",
    "encoder.conv2.weight": "onnx::Conv_2218",
    "encoder.conv2.bias": "onnx::Conv_2219",
    "quantizer._codebook.project_down.weight": "onnx::MatMul_2536",
}


def write_random_speech_tokenizer(path: Path, generation: GenerationName, *, seed: int = 0) -> None:
    """A full-size random speech tokenizer under the official ONNX file's names, as far as s3tokenizer reads them.

    s3tokenizer never runs the graph: its converters take each weight from an initializer that they find by the
    name of the node reading it (``/blocks.3/attn/query/MatMul``, ``/blocks.3/attn_ln/LayerNormalization``, ...) or
    by its own name (CosyVoice2's convolutions and quantizer, CosyVoice3's FSMN). The file holds one node per weight
    reader, with the weights as inputs and nothing in between: s3tokenizer loads it, onnxruntime cannot run it.
    s3tokenizer's modules have fixed sizes, so the file is full size (124 M weights in CosyVoice2, 242 M in
    CosyVoice3), stored in float16 to halve it (the converters hand float16 to ``load_state_dict``, which widens it).
    Matrices are N(0, 1/fan_in), biases N(0, 0.02), layer norms 1 and 0: on speech-like audio the tokens then spread
    over dozens of the 6,561 ids (one id everywhere would test little).
    """
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper

    from .speech_tokens import new_s3tokenizer_model

    with torch.device("meta"):  # the shapes alone, from s3tokenizer's own module
        shapes = {key: value.shape for key, value in new_s3tokenizer_model(generation).state_dict().items()}
    features = helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "frames"])
    name = f"random_{SPEECH_TOKENIZER_FILES[generation].removesuffix('.onnx')}"
    model = helper.make_model(helper.make_graph([], name, [features], []), opset_imports=[helper.make_opsetid("", 17)])
    nodes: dict[str, onnx.NodeProto] = {}
    generator = torch.Generator().manual_seed(seed)
    for key, shape in shapes.items():
        if key.endswith("_ln.weight"):
            weight = torch.ones(shape, dtype=torch.float16)
        else:
            scale = 0.02 if len(shape) == 1 else shape[1:].numel() ** -0.5
            weight = torch.randn(shape, generator=generator).to(torch.float16).mul_(scale)
        node_name, op_type = _speech_tokenizer_node(key, generation)
        if op_type == "MatMul":
            weight = weight.t()  # an ONNX MatMul multiplies by the transposed weight; the converters transpose it back
        initializer = _V2_ANONYMOUS_WEIGHTS.get(key) if generation == "cosyvoice2" else None
        initializer = initializer or key.removeprefix("encoder.").replace("_codebook.project_down", "project_in")
        # built in place: the graph holds a quarter to half a gigabyte, and every copy of it costs a second or two
        model.graph.initializer.append(numpy_helper.from_array(weight.numpy(), initializer))
        if node_name not in nodes:
            nodes[node_name] = model.graph.node.add(
                op_type=op_type, name=node_name, input=["feats"], output=[f"{node_name}_output_0"]
            )
        nodes[node_name].input.append(initializer)
    onnx.save(model, str(path))


def _speech_tokenizer_node(key: str, generation: GenerationName) -> tuple[str, str]:
    """The node (name, op type) that reads the s3tokenizer weight ``key``, named as the converters look for it.

    ``encoder.conv1.weight`` -> ``/conv1/Conv``, ``encoder.blocks.3.attn.query.weight`` ->
    ``/blocks.3/attn/query/MatMul`` (its bias: ``.../Add``), ``encoder.blocks.3.mlp.0.weight`` ->
    ``/blocks.3/mlp/mlp.0/MatMul``, the quantizer's projection -> ``/quantizer/project_in/MatMul``. A layer norm is
    one ``LayerNormalization`` node in CosyVoice2's export; CosyVoice3's spells it out, its scale read by a ``Mul``
    and its shift by an ``Add``.
    """
    module, parameter = key.removeprefix("encoder.").rsplit(".", 1)
    parts = module.split(".")
    if parts[0] == "quantizer":
        parts = ["quantizer", "project_in"]
    elif parts[0] == "blocks":
        parts = [f"blocks.{parts[1]}", *parts[2:]]
        if parts[1] == "mlp":
            parts[2] = f"mlp.{parts[2]}"
    if parts[-1] in ("conv1", "conv2", "fsmn_block"):
        op_type = "Conv"
    elif parts[-1].endswith("_ln"):
        op_type = "LayerNormalization" if generation == "cosyvoice2" else "Mul" if parameter == "weight" else "Add"
    else:
        op_type = "MatMul" if parameter == "weight" else "Add"
    return "/" + "/".join(parts) + f"/{op_type}", op_type


#: The random vocoder's F0 classifier is scaled so that this is the median F0 (Hz) of a random mel: unscaled, random
#: weights give F0 near 0 Hz, every frame unvoiced, and the sine source would go untested.
_RANDOM_MEDIAN_F0 = 150.0


def tiny_token2wav_config(generation: GenerationName) -> Token2WavConfig:
    """The token2wav sizes of the tiny random checkpoints: a 64-d conformer (1 + 1 layers) and a one-level U-Net of
    32 channels for CosyVoice2, a 64-d DiT of 2 blocks for CosyVoice3, HiFT with 16 base channels; the token, mel,
    speaker and audio interfaces at their released sizes."""
    from .token2wav.conformer import UpsampleConformerEncoderConfig
    from .token2wav.dit import DiTEstimatorConfig
    from .token2wav.flow import CosyVoice2FlowConfig, CosyVoice3FlowConfig
    from .token2wav.hift import CausalHiFTConfig, F0PredictorConfig, HiFTConfig
    from .token2wav.model import Token2WavConfig
    from .token2wav.unet import UNetEstimatorConfig

    hift = {"base_channels": 16, "f0_predictor": F0PredictorConfig(cond_channels=16)}
    if generation == "cosyvoice2":
        encoder = UpsampleConformerEncoderConfig(
            input_size=64, output_size=64, attention_heads=2, linear_units=128, num_blocks=1, num_up_blocks=1
        )
        return Token2WavConfig(
            generation,
            CosyVoice2FlowConfig(input_size=64, encoder=encoder),
            UNetEstimatorConfig(channels=(32,), attention_head_dim=16, n_blocks=1, num_mid_blocks=1, num_heads=2),
            HiFTConfig(**hift),
        )
    return Token2WavConfig(
        generation,
        CosyVoice3FlowConfig(pre_lookahead_channels=64),
        DiTEstimatorConfig(dim=64, depth=2, heads=2, dim_head=32),
        CausalHiFTConfig(**hift),
    )


def write_random_token2wav(dest: Path, generation: GenerationName, *, full_size: bool = False, seed: int = 0) -> None:
    """``<generation>.yaml`` in the official format, ``flow.pt`` and ``hift.pt`` (without the ``generator.`` prefix):
    random weights, tiny or (``full_size``) at the released sizes, 0.5 GB for CosyVoice2 and 1.4 GB for CosyVoice3.

    The yaml keeps the top-level sizes :func:`write_random_llm` writes, and its ``llm`` section names the LLM class
    as the official file does.
    """
    import torch

    from . import FLOW_WEIGHTS, VOCODER_WEIGHTS
    from .token2wav.model import Token2WavConfig

    config = Token2WavConfig.released(generation) if full_size else tiny_token2wav_config(generation)
    dest.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        flow, vocoder = config.build()
        mel = torch.randn(1, config.hift.in_channels, 200)
    with torch.no_grad():
        f0 = vocoder.f0_predictor(mel.double()).median()
        classifier = vocoder.f0_predictor.classifier
        classifier.weight.mul_(_RANDOM_MEDIAN_F0 / float(f0))
        classifier.bias.mul_(_RANDOM_MEDIAN_F0 / float(f0))
    torch.save(flow.state_dict(), dest / FLOW_WEIGHTS)
    torch.save(vocoder.state_dict(), dest / VOCODER_WEIGHTS)
    llm_size = QWEN2_0_5B.hidden_size if full_size else TINY_LLM.hidden_size
    (dest / f"{generation}.yaml").write_text(token2wav_yaml(config, llm_size=llm_size))


def token2wav_yaml(config: Token2WavConfig, *, llm_size: int) -> str:
    """The official ``cosyvoice{2,3}.yaml`` for these sizes, as far as inference reads it: the top-level values, the
    ``llm``, ``flow`` and ``hift`` sections and ``feat_extractor`` (the training sections are left out)."""
    v2 = config.generation == "cosyvoice2"
    flow, estimator, hift = config.flow, config.estimator, config.hift
    ratio = 2 if v2 else flow.token_mel_ratio
    chunk = estimator.static_chunk_size // ratio
    if estimator.static_chunk_size != chunk * ratio or (v2 and flow.encoder.static_chunk_size != chunk):
        raise ValueError(f"the encoder's and the estimator's chunks do not follow one chunk_size x {ratio}")
    if v2:
        encoder = flow.encoder
        # upstream builds 4 layers after the upsampling and takes no argument for it
        up_blocks = "" if encoder.num_up_blocks == 4 else f"\n        num_up_blocks: {encoder.num_up_blocks}"
        tokens_to_mu = f"""\
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: {encoder.output_size}
        attention_heads: {encoder.attention_heads}
        linear_units: {encoder.linear_units}
        num_blocks: {encoder.num_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: {encoder.input_size}
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>{up_blocks}"""
        estimator_text = f"""\
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: {estimator.in_channels}
            out_channels: {estimator.out_channels}
            channels: {_yaml(estimator.channels)}
            dropout: {_yaml(estimator.dropout)}
            attention_head_dim: {estimator.attention_head_dim}
            n_blocks: {estimator.n_blocks}
            num_mid_blocks: {estimator.num_mid_blocks}
            num_heads: {estimator.num_heads}
            act_fn: {_yaml(estimator.act_fn)}"""
    else:
        tokens_to_mu = f"""\
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: {flow.input_size}
        channels: {flow.pre_lookahead_channels}
        pre_lookahead_len: {flow.pre_lookahead_len}"""
        # the DiT's dropout is left at upstream's default (0.1), as the released yaml leaves it
        estimator_text = f"""\
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {estimator.dim}
            depth: {estimator.depth}
            heads: {estimator.heads}
            dim_head: {estimator.dim_head}
            ff_mult: {estimator.ff_mult}
            mel_dim: {estimator.mel_dim}
            mu_dim: {estimator.mu_dim}
            spk_dim: {estimator.spk_dim}
            out_channels: {estimator.out_channels}"""
    flow_class = "CausalMaskedDiffWithXvec" if v2 else "CausalMaskedDiffWithDiT"
    llm_class = "Qwen2LM" if v2 else "CosyVoice3LM"
    hift_class, f0_class = (
        ("HiFTGenerator", "ConvRNNF0Predictor") if v2 else ("CausalHiFTGenerator", "CausalConvRNNF0Predictor")
    )
    look_right = "" if v2 else f"\n    conv_pre_look_right: {hift.conv_pre_look_right}"
    return f"""\
# set random seed, so that you may reproduce your result.
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
__set_seed4: !apply:torch.cuda.manual_seed_all [1986]

# fixed params
sample_rate: {hift.sampling_rate}
llm_input_size: {llm_size}
llm_output_size: {llm_size}
spk_embed_dim: {flow.spk_embed_dim}
speech_token_size: {SPEECH_TOKENS}
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: {ratio}

# stream related params
chunk_size: {chunk} # streaming inference chunk size, in token
num_decoding_left_chunks: {estimator.num_decoding_left_chunks}

# model params
llm: !new:cosyvoice.llm.llm.{llm_class}
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {SPEECH_TOKENS}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.{flow_class}
    input_size: {flow.input_size}
    output_size: {flow.output_size}
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {flow.vocab_size}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: {flow.pre_lookahead_len}
{tokens_to_mu}
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: {_yaml(flow.cfm_params.inference_cfg_rate)}
                reg_loss_type: 'l1'
{estimator_text}
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.{hift_class}
    in_channels: {hift.in_channels}
    base_channels: {hift.base_channels}
    nb_harmonics: {hift.nb_harmonics}
    sampling_rate: !ref <sample_rate>
    nsf_alpha: {_yaml(hift.nsf_alpha)}
    nsf_sigma: {_yaml(hift.nsf_sigma)}
    nsf_voiced_threshold: {_yaml(hift.nsf_voiced_threshold)}
    upsample_rates: {_yaml(hift.upsample_rates)}
    upsample_kernel_sizes: {_yaml(hift.upsample_kernel_sizes)}
    istft_params:
        n_fft: {hift.n_fft}
        hop_len: {hift.hop_len}
    resblock_kernel_sizes: {_yaml(hift.resblock_kernel_sizes)}
    resblock_dilation_sizes: {_yaml(hift.resblock_dilation_sizes)}
    source_resblock_kernel_sizes: {_yaml(hift.source_resblock_kernel_sizes)}
    source_resblock_dilation_sizes: {_yaml(hift.source_resblock_dilation_sizes)}
    lrelu_slope: {_yaml(hift.lrelu_slope)}
    audio_limit: {_yaml(hift.audio_limit)}{look_right}
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.{f0_class}
        num_class: {hift.f0_predictor.num_class}
        in_channels: {hift.f0_predictor.in_channels}
        cond_channels: {hift.f0_predictor.cond_channels}

# the reference's mel that conditions the flow
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: {8000 if v2 else "null"}
    center: False
"""


def _yaml(value: Any) -> str:
    """A value in YAML flow style: lists as ``[1, 2]``, strings quoted, floats with their point."""
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, tuple | list):
        return json.dumps(value)
    return repr(value)
