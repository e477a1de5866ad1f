"""Fixtures for the perf tests: a tiny tokenizer, fake LLM models on the real tritonserver, deployment folders."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from trtdeploy import ModelSpec
from trtdeploy.hookspecs import hookimpl
from trtdeploy.plugins import forget_registrations, pm

from ..manifests import write_manifest

MODELS = Path(__file__).parent / "models"

_TEXT_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
{policy}
input [
  {{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "max_tokens", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "stream", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "end_id", data_type: TYPE_INT32, dims: [ 1 ], optional: true }},
  {{ name: "temperature", data_type: TYPE_FP32, dims: [ 1 ], optional: true }},
  {{ name: "runtime_top_k", data_type: TYPE_INT32, dims: [ 1 ], optional: true }},
  {{ name: "runtime_top_p", data_type: TYPE_FP32, dims: [ 1 ], optional: true }},
  {{ name: "random_seed", data_type: TYPE_UINT64, dims: [ 1 ], optional: true }}
]
output [
  {{ name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] }}{ids}
]
parameters {{ key: "token_delay_ms", value: {{ string_value: "{delay}" }} }}
parameters {{ key: "with_ids", value: {{ string_value: "{with_ids}" }} }}
parameters {{ key: "tokenizer_dir", value: {{ string_value: "{tokenizer_dir}" }} }}
parameters {{ key: "text_llm", value: {{ string_value: "qwen_llm" }} }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""

_TOKEN_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
{policy}
input [
  {{ name: "input_ids", data_type: TYPE_INT32, dims: [ -1 ] }},
  {{ name: "input_lengths", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "request_output_len", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "streaming", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "end_id", data_type: TYPE_INT32, dims: [ 1 ], optional: true }}{exclude}
]
output [
  {{ name: "output_ids", data_type: TYPE_INT32, dims: [ -1, -1 ] }},
  {{ name: "sequence_length", data_type: TYPE_INT32, dims: [ -1 ] }}
]
parameters {{ key: "token_delay_ms", value: {{ string_value: "{delay}" }} }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""

#: name → (source, decoupled, token delay in ms, with output_ids)
FAKE_MODELS = {
    "text_llm": ("fake_text_llm.py", False, 1, True),
    "text_llm_stream": ("fake_text_llm.py", True, 5, True),
    "text_llm_noids": ("fake_text_llm.py", True, 1, False),
    "text_llm_tokens": ("fake_text_llm.py", True, 1, True),
    "tensorrt_llm": ("fake_token_llm.py", True, 2, True),
    "tensorrt_llm_offline": ("fake_token_llm.py", False, 1, True),
    "tensorrt_llm_exclude": ("fake_token_llm.py", False, 1, True),
}
#: Models that generate the real token ids of the tokenizer given to write_fake_repo.
TOKENIZED = {"text_llm_tokens"}
#: Models that take exclude_input_in_output (and honour it).
EXCLUDING = {"tensorrt_llm_exclude"}


def write_fake_repo(root: Path, names: Iterable[str] = FAKE_MODELS, tokenizer_dir: Path | None = None) -> Path:
    """A model repository with (some of) the fake LLMs of FAKE_MODELS (those of TOKENIZED need ``tokenizer_dir``)."""
    for name in names:
        source, decoupled, delay, with_ids = FAKE_MODELS[name]
        if name in TOKENIZED and tokenizer_dir is None:
            raise ValueError(f"the fake model {name} needs a tokenizer_dir")
        (root / name / "1").mkdir(parents=True)
        shutil.copy(MODELS / source, root / name / "1" / "model.py")
        template = _TEXT_CONFIG if source == "fake_text_llm.py" else _TOKEN_CONFIG
        exclude = ',\n  { name: "exclude_input_in_output", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }'
        config = template.format(
            name=name,
            policy="model_transaction_policy { decoupled: true }" if decoupled else "",
            delay=delay,
            with_ids="true" if with_ids else "false",
            ids=',\n  { name: "output_ids", data_type: TYPE_INT32, dims: [ -1 ] }' if with_ids else "",
            tokenizer_dir=tokenizer_dir if name in TOKENIZED else "",
            exclude=exclude if name in EXCLUDING else "",
        )
        (root / name / "config.pbtxt").write_text(config.lstrip())
    return root


def write_fake_whisper(dest: Path, *, decoupled: bool = False, length_inputs: bool = True) -> Path:
    """The fake whisper_bls (models/fake_whisper) as the model folder ``dest``: streaming partial transcripts when
    ``decoupled``; without MAX_NEW_TOKENS/IGNORE_EOS (NVIDIA's contract exactly) unless ``length_inputs``."""
    shutil.copytree(MODELS / "fake_whisper", dest, ignore=shutil.ignore_patterns("__pycache__"))
    config = (dest / "config.pbtxt").read_text()
    if not length_inputs:
        config = "".join(line for line in config.splitlines(keepends=True) if "optional: true" not in line)
        config = config.replace("TYPE_INT32, dims: [ 1 ] },\n]", "TYPE_INT32, dims: [ 1 ] }\n]")
    if decoupled:
        config += "model_transaction_policy { decoupled: true }\n"
    (dest / "config.pbtxt").write_text(config)
    return dest


def write_tiny_tokenizer(dest: Path) -> Path:
    """A byte-level BPE trained on a few sentences, saved so that AutoTokenizer loads it offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    sentences = [
        "the quick brown fox jumps over the lazy dog",
        "hello world, this is a tiny tokenizer for tests",
        "triton serves large language models and speech models",
    ]
    tokenizer.train_from_iterator(sentences * 10, trainer)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(dest / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def fake_server(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Path) -> Iterator:
    """The bundled tritonserver serving the fake LLMs (started once per session)."""
    from trtdeploy.server import launch

    from ..server.helpers import off_default_ports

    root = tmp_path_factory.mktemp("perf-server")
    repo = write_fake_repo(root / "repo", tokenizer_dir=tiny_tokenizer)
    with launch(repo, log_file=root / "tritonserver.log", timeout=120, **off_default_ports()) as server:
        yield server


@pytest.fixture
def make_deployment(tmp_path: Path, tiny_tokenizer: Path) -> Callable[..., Path]:
    """``make_deployment(model, entry_model, mode, models, **point)``: a deployment folder as `trtdeploy build`
    leaves it, its model repository holding ``models`` of the fake LLMs (none by default); ``point`` overrides
    fields of its build point (``max_output_len=16``)."""

    def make(
        model: str = "perf_fake_llm",
        entry_model: str = "text_llm_stream",
        mode: str = "streaming",
        models: Iterable[str] = (),
        **point: object,
    ) -> Path:
        path = tmp_path / "deployments" / model / f"torch-fp32-bs8-tp1pp1-{mode}"
        path.mkdir(parents=True)
        models = list(models)
        write_fake_repo(path / "model_repo", models, tokenizer_dir=tiny_tokenizer)
        return write_manifest(
            path, models=models, entry_model=entry_model, model=model, mode=mode, llm_dir=tiny_tokenizer, **point
        )

    return make


class FakeModelSpec(ModelSpec):
    """A model plugin without a checkpoint, for perf runs on hand-made deployments of the fake models: subclasses
    name the model, its entry and its workload."""

    default_repo = "none/none"
    templates_dir = Path(__file__).parent

    def validate_checkpoint(self, checkpoint_dir):
        return None

    def write_random_checkpoint(self, dest, *, seed=0):
        return None


class _FakeLLM(FakeModelSpec):
    """A model plugin whose workload is the text contract of the fake LLMs."""

    name = "perf_fake_llm"

    def entry_model(self, mode):
        return "text_llm_stream" if mode == "streaming" else "text_llm"

    def workload(self, deployment):
        from trtdeploy.perf.llm import TextLLMWorkload

        return TextLLMWorkload(deployment.entry_model, deployment.llm_dir, decoupled=deployment.decoupled)


class _FakePlugin:
    @hookimpl
    def register_models(self, register):
        register(_FakeLLM())


@pytest.fixture
def fake_plugin():
    """The model plugin of ``make_deployment``'s deployments (``perf_fake_llm``), registered for the test."""
    pm.register(_FakePlugin(), name="perf-fake-llm")
    forget_registrations()
    yield
    pm.unregister(name="perf-fake-llm")
    forget_registrations()
