"""What changes between the TensorRT-LLM release lines the trtllm engine plans for: one row per line, each fact with
where it was read (``repository@tag:path``). Planning for the next release is one more row. The rows also say what a
plugin's copy of the official ensemble differs by (``trtdeploy.trtllm_release``).

The TensorRT-LLM repository could not be read at its own tags (its history is too large to copy here). Up to 0.19
the facts come from tensorrtllm_backend's tags, whose ``tensorrt_llm`` submodule pins the TensorRT-LLM commit of each
release and whose CI scripts and templates use that commit's files; from 0.20 the backend lives in TensorRT-LLM's
``triton_backend/``, and the facts come from tensorrtllm_backend's history up to the move, TensorRT-LLM's release
notes and pull requests, and ``triton_backend/`` read at untagged commits. A fact that was not read at the release's
own tag is listed in the row's ``unconfirmed``, and the plan notes say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BACKEND = "triton-inference-server/tensorrtllm_backend"
TRTLLM = "NVIDIA/TensorRT-LLM"
CONFIG = "all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt"
ENSEMBLE = "all_models/inflight_batcher_llm/ensemble/config.pbtxt"
TENSORS = f"{CONFIG}, inflight_batcher_llm/src/model_instance_state.cc"
RELEASE_NOTES = f"{TRTLLM}:docs/source/release-notes.md"
#: Where the backend lives from 0.20, and where its files were read (no tag: TensorRT-LLM's main branch).
TRITON_BACKEND = f"{TRTLLM}:triton_backend/"
UNTAGGED = "read at untagged commits 0c8de69 and 2a9abd9"

#: Per-model converters: examples/<model>/ ("") or examples/models/core/<model>/.
FLAT = ""
CORE = "models/core/"
#: What the C++ backend writes when a request asks for its statistics.
KV_CACHE_REUSE_OUTPUTS = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks")
PERF_METRICS_OUTPUTS = (
    *KV_CACHE_REUSE_OUTPUTS,
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
)
#: The official ensemble's structured-output inputs (the guide's type and the guide).
GUIDED_DECODING_INPUTS = ("guided_decoding_guide_type", "guided_decoding_guide")
#: The switches that ask the backend for a request's token counts, and the outputs it then writes.
TOKEN_COUNT_INPUTS = ("return_num_input_tokens", "return_num_output_tokens")
TOKEN_COUNT_OUTPUTS = ("num_input_tokens", "num_output_tokens")
#: Hugging Face architectures whose converter (``convert_checkpoint.py``, ``tensorrt_llm.models.MODEL_MAP``) every
#: supported release has, and the Qwen3 ones it gained in 1.0.
ARCHITECTURES = frozenset({"Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"})
QWEN3 = frozenset({"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"})
#: The ``--model_name`` choices of the Whisper converter (the name only picks ``<model_dir>/<name>.pt``): the older
#: converter (``examples/whisper/``, encoder weights named ``encoder_layers.*``) has no large-v3-turbo.
WHISPER_NAMES = (
    "large-v3",
    "large-v2",
    "medium",
    "small",
    "base",
    "tiny",
    "medium.en",
    "small.en",
    "base.en",
    "tiny.en",
    "distil-large-v3",
    "distil-large-v2",
    "distil-medium.en",
    "distil-small.en",
)
WHISPER_NAMES_TURBO = ("large-v3-turbo", *WHISPER_NAMES)
WHISPER_OLD_SOURCE = (
    f"{TRTLLM}:examples/whisper/convert_checkpoint.py (read at untagged 102f11a: no large-v3-turbo, --chunk_length, "
    "encoder_layers.* weights); triton-inference-server/tensorrtllm_backend issues 707 (2025-03-04) and 741 (r25.02): "
    "the wheel of the 25.02 image wants encoder_layers.* names, which a converter offering large-v3-turbo does not "
    "write"
)
WHISPER_NEW_SOURCE = (
    f"{TRTLLM}:examples/models/core/whisper/convert_checkpoint.py (read at untagged 2a9abd9: large-v3-turbo among "
    "the choices); a converter offering it was on main by 2025-03-04 (tensorrtllm_backend issue 707), before the "
    "0.20 branch"
)

#: Precisions whose GEMM kernels have no SM10.x (B200, GB200) path in the engine flow, and which kernel it is: its
#: dispatch throws "Arch unsupported" there, so trtllm-build fails while it profiles the layer. Refused.
_MIXED_GEMM = "the mixed-type GEMM of its layers (16-bit activations x integer weights)"
SM100_UNSUPPORTED = {
    "int8_sq": "SmoothQuant's CUTLASS int8 GEMM has no SM10.x dispatch in any source read",
    **dict.fromkeys(
        ("int8_wo", "int4_wo", "int4_awq"),
        f"{_MIXED_GEMM} dispatches SM70-SM90; only a later source, in no release pinned, sends SM100+ to its SM80 "
        "kernels",
    ),
}
#: The same precisions on SM12.x (RTX 50 series, RTX PRO 6000 Blackwell): the later sources read have kernels for
#: them there, the older ones do not, and neither is pinned to a release. Planned, with a note saying so.
SM120_UNPINNED = {
    "int8_sq": "SmoothQuant's int8 GEMM dispatches SM120 in a later source, SM72-SM90 only in an older one",
    **dict.fromkeys(
        ("int8_wo", "int4_wo", "int4_awq"),
        f"{_MIXED_GEMM} sends SM100 and newer to its SM80 kernels in a later source, dispatches SM70-SM90 only "
        "in an older one",
    ),
}
SM100_SOURCE = (
    f"{TRTLLM}:cpp/tensorrt_llm/kernels/cutlass_kernels/int8_gemm/int8_gemm_template.h (dispatchToArch: SM72-90, "
    "later also SM120+, never SM100) and fpA_intB_gemm/fpA_intB_gemm_template.h (dispatch_to_arch: SM70-90; a later "
    "source routes SM100+ to the SM80 kernels), read at untagged commits: no release pinned"
)

#: What each fact of a row decides, for the plan notes.
FACTS = {
    "examples_layout": "where the converters sit",
    "seed_input": "the seed and minimum-length input names",
    "stats_input": "the statistics input and outputs",
    "guided_decoding_inputs": "the ensemble's guided-decoding inputs",
    "token_count_inputs": "the token-count inputs and outputs",
    "architectures": "the architectures converted",
    "sm100_unsupported": "the precisions refused on SM10.x",
    "sm120_unpinned": "the precisions planned with a warning on SM12.x",
    "whisper_model_names": "the Whisper converter's model names",
}


@dataclass(frozen=True)
class Release:
    """The facts of one TensorRT-LLM release line that a plan, the ``tensorrt_llm`` model's tensors and a plugin's
    copy of the official ensemble depend on."""

    line: tuple[int, int]
    #: Where the per-model converters sit under ``examples/``.
    examples_layout: str
    #: The C++ backend's names for the LLM contract's ``random_seed`` and ``min_length`` inputs (the official
    #: ensemble's too).
    seed_input: str
    min_tokens_input: str
    #: The boolean input that asks for per-request statistics, and the outputs the backend then writes.
    stats_input: str
    stats_outputs: tuple[str, ...]
    #: The official ensemble's guided-decoding inputs (none before 0.19).
    guided_decoding_inputs: tuple[str, ...]
    #: The inputs that ask for a request's input and output token counts, and the outputs the backend then writes
    #: (none before 1.0).
    token_count_inputs: tuple[str, ...]
    token_count_outputs: tuple[str, ...]
    #: Architectures the engine flow converts.
    architectures: frozenset[str]
    #: Where the backend's templates and launch script live.
    backend_home: str
    #: The Whisper converter's ``--model_name`` choices.
    whisper_model_names: tuple[str, ...]
    #: Precisions the engine builder cannot build for SM10.x GPUs -> why (refused).
    sm100_unsupported: dict[str, str] = field(compare=False)
    #: Precisions whose SM12.x kernels the sources do not pin to this release -> why (planned with a note).
    sm120_unpinned: dict[str, str] = field(compare=False)
    #: Fact (field name) -> where it was read.
    sources: dict[str, str] = field(compare=False)
    #: Facts not read at this release's own tag (inferred from the neighbouring history; see ``sources``).
    unconfirmed: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.line[0]}.{self.line[1]}"


def _backend_row(
    line: tuple[int, int],
    tag: str,
    *,
    stats_input: str,
    stats_outputs: tuple[str, ...],
    guided_decoding_inputs: tuple[str, ...],
) -> Release:
    """A release whose backend is tensorrtllm_backend at ``tag`` (0.17 to 0.19)."""
    return Release(
        line=line,
        examples_layout=FLAT,
        seed_input="random_seed",
        min_tokens_input="min_length",
        stats_input=stats_input,
        stats_outputs=stats_outputs,
        guided_decoding_inputs=guided_decoding_inputs,
        token_count_inputs=(),
        token_count_outputs=(),
        architectures=ARCHITECTURES,
        backend_home=BACKEND,
        whisper_model_names=WHISPER_NAMES,
        sm100_unsupported=SM100_UNSUPPORTED,
        sm120_unpinned=SM120_UNPINNED,
        sources={
            "examples_layout": f"{BACKEND}@{tag}:ci/L0_backend_trtllm/generate_engines.sh builds from "
            "tensorrt_llm/examples/gpt (the submodule pins this release's TensorRT-LLM)",
            "seed_input": f"{BACKEND}@{tag}:{TENSORS}",
            "stats_input": f"{BACKEND}@{tag}:{TENSORS}",
            "guided_decoding_inputs": f"{BACKEND}@{tag}:{ENSEMBLE}",
            "token_count_inputs": f"{BACKEND}@{tag}:{CONFIG} (none)",
            "architectures": f"{RELEASE_NOTES} (Qwen3 in the TensorRT engine flow from 1.0)",
            "sm100_unsupported": SM100_SOURCE,
            "sm120_unpinned": SM100_SOURCE,
            "whisper_model_names": WHISPER_OLD_SOURCE,
        },
        unconfirmed=("sm100_unsupported", "sm120_unpinned", "whisper_model_names"),
    )


def _trtllm_row(line: tuple[int, int], *, architectures: frozenset[str], token_counts: bool) -> Release:
    """A release whose backend lives in TensorRT-LLM's ``triton_backend/`` (0.20 on)."""
    qwen3 = (
        f"{RELEASE_NOTES} 1.0: 'Add TensorRT-Engine Qwen3 (dense) model support', 'Add Qwen3 MoE support to "
        f"TensorRT backend' ({TRTLLM} pull requests 5650, merged 2025-07-10, and 6470)"
        if architectures & QWEN3
        else f"{RELEASE_NOTES} (no TensorRT-engine Qwen3 before 1.0; {TRTLLM} issue 5450, 2025-06-24: "
        "convert_checkpoint.py refuses qwen_type qwen3 on main)"
    )
    token_count_source = (
        f"{TRITON_BACKEND}{CONFIG} and {ENSEMBLE} ({UNTAGGED}); added by {TRTLLM} pull request 5445 (merged "
        "2025-06-27, after 0.20.0)"
        if token_counts
        else f"{TRTLLM} pull request 5445 adds them on 2025-06-27, after 0.20.0"
        + (" (whether the 0.21 branch has them was not read)" if line == (0, 21) else "")
    )
    return Release(
        line=line,
        examples_layout=CORE,
        seed_input="seed",
        min_tokens_input="min_tokens",
        stats_input="return_perf_metrics",
        stats_outputs=PERF_METRICS_OUTPUTS,
        guided_decoding_inputs=GUIDED_DECODING_INPUTS,
        token_count_inputs=TOKEN_COUNT_INPUTS if token_counts else (),
        token_count_outputs=TOKEN_COUNT_OUTPUTS if token_counts else (),
        architectures=architectures,
        backend_home=TRITON_BACKEND,
        whisper_model_names=WHISPER_NAMES_TURBO,
        sm100_unsupported=SM100_UNSUPPORTED,
        sm120_unpinned=SM120_UNPINNED,
        sources={
            "examples_layout": f"{RELEASE_NOTES} 0.20.0 cites examples/models/core/qwen/README.md (0.19.0 cites flat "
            f"paths); {BACKEND} dbae4e8 (2025-04-23, after the v0.19.0 branch) moves its CI to "
            "tensorrt_llm/examples/models/core/gpt",
            "seed_input": f"{BACKEND} c2e65b8 (#749, 2025-05-13, not in v0.19.0) renames random_seed/min_length to "
            f"seed/min_tokens in {CONFIG}; the backend then moved into TensorRT-LLM ({BACKEND} 6a749f5, 2025-05-20; "
            f"@v0.20.0 to @v1.0.0 hold only the tensorrt_llm submodule) and {TRITON_BACKEND}{CONFIG} ({UNTAGGED}) "
            "has seed/min_tokens",
            "stats_input": f"{TRITON_BACKEND}{CONFIG} ({UNTAGGED}; the outputs of {BACKEND}@v0.19.0)",
            "guided_decoding_inputs": f"{TRITON_BACKEND}{ENSEMBLE} ({UNTAGGED}; as {BACKEND}@v0.19.0)",
            "token_count_inputs": token_count_source,
            "architectures": qwen3,
            "sm100_unsupported": SM100_SOURCE,
            "sm120_unpinned": SM100_SOURCE,
            "whisper_model_names": WHISPER_NEW_SOURCE,
        },
        unconfirmed=(
            "examples_layout",
            "seed_input",
            "stats_input",
            "guided_decoding_inputs",
            "token_count_inputs",
            "sm100_unsupported",
            "sm120_unpinned",
            "whisper_model_names",
        ),
    )


#: Oldest first; the engine plans for exactly these lines.
RELEASES = (
    *(
        _backend_row(
            line,
            tag,
            stats_input="return_kv_cache_reuse_stats",
            stats_outputs=KV_CACHE_REUSE_OUTPUTS,
            guided_decoding_inputs=(),
        )
        for line, tag in (((0, 17), "v0.17.0"), ((0, 18), "v0.18.2"))
    ),
    _backend_row(
        (0, 19),
        "v0.19.0",
        stats_input="return_perf_metrics",
        stats_outputs=PERF_METRICS_OUTPUTS,
        guided_decoding_inputs=GUIDED_DECODING_INPUTS,
    ),
    _trtllm_row((0, 20), architectures=ARCHITECTURES, token_counts=False),
    _trtllm_row((0, 21), architectures=ARCHITECTURES, token_counts=False),
    *(_trtllm_row(line, architectures=ARCHITECTURES | QWEN3, token_counts=True) for line in ((1, 0), (1, 1), (1, 2))),
)


def of(line: tuple[int, int]) -> Release:
    """The row of a release line (LookupError for a line the table does not have)."""
    for release in RELEASES:
        if release.line == line:
            return release
    raise LookupError(f"no facts for TensorRT-LLM {line[0]}.{line[1]}")


def newest() -> Release:
    """The newest line's row: what engines not tied to a release (torch, trtllm_pytorch) follow."""
    return RELEASES[-1]


def first_with(architecture: str) -> Release | None:
    """The oldest release whose engine flow converts ``architecture``."""
    return next((release for release in RELEASES if architecture in release.architectures), None)


#: Where the orchestrator-mode launch (launch_triton_server.py --multi-model) was read; the same in every tag read.
LAUNCH_SOURCE = f"{BACKEND}@v0.17.0 and @v0.19.0:scripts/launch_triton_server.py (add_multi_model_config, get_cmd)"
