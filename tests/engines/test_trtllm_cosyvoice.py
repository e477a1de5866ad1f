"""The trtllm engine's plans for CosyVoice2 and CosyVoice3: the converted LLM's commands per TensorRT-LLM release and
precision (golden files headed by the official stage 1 they were checked against), and the plan notes that say where
a deployment departs from that stage 1 and the official model repository. No TensorRT-LLM is needed to plan."""

from __future__ import annotations

import shutil

import pytest

from trtdeploy import build
from trtdeploy.plugins import get_model
from trtdeploy.server._process import launch

from .trtllm_helpers import COMMANDS_GOLDEN, PRECISIONS, QWEN25_05B, VERSIONS, check_golden, commands, plan, with_config

GENERATIONS = ("cosyvoice2", "cosyvoice3")
#: The converted LLM at its released size: CosyVoice-BlankEN is Qwen2-0.5B's shape; the vocabulary is the official
#: conversions' (text tokens, speech tokens, padded to 128 rows; the plugin's test_convert checks ours pads alike),
#: with an untied head, in bfloat16 as those conversions save it.
RELEASED_LLM = {
    "cosyvoice2": {**QWEN25_05B, "vocab_size": 158336, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "cosyvoice3": {**QWEN25_05B, "vocab_size": 158720, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
}
#: The official stage 1's engine batch (run.sh: 16; run_cosyvoice3.sh: 64), on the GPU of the published figures.
OFFICIAL_BATCH = {"cosyvoice2": 16, "cosyvoice3": 64}
GPU = "L20"
#: The TensorRT-LLM of the official image (tritonserver 25.06, both generations).
OFFICIAL_RELEASE = "0.20.0"


@pytest.fixture(scope="module", autouse=True)
def conversion_cache(tmp_path_factory):
    """The module's plans keep their LLM conversions in a cache folder of their own, not the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRTDEPLOY_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def cosyvoice_plan(checkpoint, root, generation, **changes) -> build.Plan:
    """The generation's plan on an L20, at the official batch unless ``changes`` say otherwise."""
    changes = {"gpu": GPU, "max_batch_size": OFFICIAL_BATCH[generation], **changes}
    return plan(checkpoint, root, model=generation, **changes)


@pytest.fixture(scope="module")
def converted(trtdeploy_checkpoint, tmp_path_factory):
    """``converted(generation)``: the generation's tiny checkpoint, its LLM converted where a build keeps it, with
    the released LLM's config.json (a plan reads no weights)."""
    done = {}

    def checkpoint(generation):
        if generation not in done:
            source = trtdeploy_checkpoint(generation)
            llm_dir = cosyvoice_plan(source, tmp_path_factory.mktemp("plan"), generation).context.llm_dir
            get_model(generation).convert_llm(source, llm_dir)
            with_config(llm_dir, RELEASED_LLM[generation])
            done[generation] = source
        return done[generation]

    return checkpoint


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_converted_llm_commands_per_release_and_precision(converted, tmp_path, generation, version):
    checkpoint = converted(generation)
    sections = []
    for precision in PRECISIONS:
        found = cosyvoice_plan(checkpoint, tmp_path, generation, precision=precision, engine_version=version)
        sections.append(f"## {precision}\n{commands(found, found.context.llm_dir, '<converted-llm>')}\n")
    check_golden(f"{generation}-llm/{COMMANDS_GOLDEN[version]}", "".join(sections))


#: What each generation's notes say of the official runtime beside the stage 1 flags: the KV pool that caps
#: CosyVoice2's concurrency (its model repository's tensorrt_llm config), CosyVoice3's trtllm-serve.
OFFICIAL_KV_POOL = {
    "cosyvoice2": ("caps it at 2560 tokens", "max_attention_window_size 2560", "kv_cache_free_gpu_mem_fraction 0.5"),
    "cosyvoice3": ("trtllm-serve --max_batch_size 64 --kv_cache_free_gpu_memory_fraction 0.4",),
}
#: The non-tensorrtllm models of a streaming deployment (these the bundled server loads without TensorRT-LLM).
LOADABLE = {
    "cosyvoice2": [
        "audio_tokenizer",
        "cosyvoice2",
        "cosyvoice2_offline",
        "reference_voice",
        "speaker_embedding",
        "token2wav",
    ],
    "cosyvoice3": [
        "audio_tokenizer",
        "cosyvoice3",
        "cosyvoice3_offline",
        "reference_voice",
        "speaker_embedding",
        "token2wav",
        "vocoder",
    ],
}


@pytest.mark.server
@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_notes_say_where_the_plan_departs_from_the_official_stage_1(converted, tmp_path, generation):
    checkpoint = converted(generation)
    batch = OFFICIAL_BATCH[generation]
    # two entry instances: what loads does not depend on their count, and this host has few cores
    found = cosyvoice_plan(
        checkpoint, tmp_path / "d", generation, engine_version=OFFICIAL_RELEASE, options={"bls_instances": "2"}
    )
    notes = "\n".join(found.notes)
    engine_note = f"trtllm-build: max_batch_size {batch} (as the official); max_num_tokens 8192 (official 32768)"
    assert engine_note in notes
    assert "gemm_plugin auto, the converter's dtype (bfloat16 at bf16, what the official names)" in notes
    assert "max_input_len 4048 (official: trtllm-build's default 1024)" in notes
    assert f"KV-cache pool of {batch * 4048} tokens (max_batch_size x max_seq_len)" in notes
    assert all(official in notes for official in OFFICIAL_KV_POOL[generation])
    hang = (
        "non-decoupled call (the prompt plus the tokens so far), so the decoupled-LLM hang cannot happen: the official "
        "CosyVoice2 streaming's decoupled tensorrt_llm model stops generating after the first streamed request "
        "(CosyVoice issue 1866)"
    )
    assert hang in notes
    assert ("avoids by serving its LLM with trtllm-serve" in notes) == (generation == "cosyvoice3")
    build_command = commands(found, found.context.llm_dir).splitlines()[1]
    assert f"--max_batch_size {batch} --max_input_len 4048 --max_seq_len 4048 --max_num_tokens 8192" in build_command
    assert build_command.endswith("--gemm_plugin auto")
    smaller = cosyvoice_plan(checkpoint, tmp_path / "s", generation, precision="fp8", max_batch_size=8)
    assert "trtllm-build: precision fp8 (official bf16), max_batch_size 8 (official " in "\n".join(smaller.notes)

    configs = build.render_repository(found.templates, tmp_path / "repo")
    llm = configs["tensorrt_llm"].read_text()
    assert "decoupled: false" in llm
    assert f'"max_tokens_in_paged_kv_cache" value: {{ string_value: "{batch * 4048}" }}' in llm
    loadable = sorted(name for name, path in configs.items() if 'backend: "tensorrtllm"' not in path.read_text())
    assert loadable == LOADABLE[generation]
    for path in configs.values():  # built for the L20; this host has no GPU
        path.write_text(path.read_text().replace('string_value: "cuda"', 'string_value: "cpu"'))
    explicit = ["--model-control-mode=explicit", *(f"--load-model={name}" for name in loadable)]
    with launch(tmp_path / "repo", models=loadable, extra_args=explicit, timeout=300) as server:
        assert server.is_ready(loadable)


def test_offline_notes_leave_out_the_streaming_hang(converted, tmp_path):
    found = cosyvoice_plan(converted("cosyvoice2"), tmp_path, "cosyvoice2", mode="offline")
    notes = "\n".join(found.notes)
    assert "decoupled-LLM hang" not in notes and "trtllm-build: max_batch_size 16 (as the official)" in notes


def test_a_float32_llm_gets_bfloat16_activations_in_quantized_plans(trtdeploy_checkpoint, tmp_path):
    """The official llm.pt may hold float32 weights, which the conversion keeps: quantized plans still compute in
    bfloat16, the official conversions' type, not in float16 with its narrower range."""
    source = tmp_path / "checkpoint"
    shutil.copytree(trtdeploy_checkpoint("cosyvoice2"), source)
    llm_dir = cosyvoice_plan(source, tmp_path / "plan", "cosyvoice2").context.llm_dir
    get_model("cosyvoice2").convert_llm(source, llm_dir)
    with_config(llm_dir, {**RELEASED_LLM["cosyvoice2"], "torch_dtype": "float32"})
    for precision in ("int8_wo", "int4_awq", "fp8"):
        found = cosyvoice_plan(source, tmp_path / precision, "cosyvoice2", precision=precision)
        assert "--dtype bfloat16" in commands(found, llm_dir).splitlines()[0]
