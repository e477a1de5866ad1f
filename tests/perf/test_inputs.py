"""Input rows: jsonl files, local datasets through `datasets`, synthetic prompts of exact token lengths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trtdeploy.errors import NetworkError, NotFoundError, UsageError
from trtdeploy.perf.inputs import load_dataset_rows, load_jsonl, synthetic_prompts
from trtdeploy.perf.llm import TextLLMWorkload, TokenLLMWorkload, load_tokenizer
from trtdeploy.perf.runner import InputSpec


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_rows_with_references_and_blank_lines(tmp_path):
    path = _write(
        tmp_path / "prompts.jsonl",
        ['{"input": "hello", "output": "world"}', "", '{"input": "again", "max_tokens": 5}'],
    )
    rows = load_jsonl(path)
    assert [(r.input, r.reference, r.max_tokens) for r in rows] == [("hello", "world", None), ("again", None, 5)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"input": "a",}', "not valid JSON"),
        ('["input"]', "expected a JSON object, got list"),
        ('{"prompt": "a", "output": "b"}', 'no "input" key (keys: prompt, output)'),
        ('{"input": "a", "max_tokens": 0}', '"max_tokens" must be a positive integer'),
        ('{"input": "half a pair \\ud83d here"}', "holds a lone surrogate (\\ud83d), which is not valid Unicode"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, line, message):
    path = _write(tmp_path / "prompts.jsonl", ['{"input": "fine"}', line])
    with pytest.raises(UsageError) as caught:
        load_jsonl(path)
    assert caught.value.message.startswith(f"{path}:2: ")
    assert message in caught.value.message


def test_jsonl_missing_or_empty(tmp_path):
    with pytest.raises(NotFoundError, match="does not exist"):
        load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(UsageError, match="has no rows"):
        load_jsonl(_write(tmp_path / "empty.jsonl", ["", "  "]))


@pytest.fixture
def local_csv(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("query,answer\nwhat is up,the sky\nhow are you,fine\n")
    return path


def test_local_dataset_file_with_explicit_columns(local_csv):
    rows = load_dataset_rows(str(local_csv), column="query", reference_column="answer")
    assert [(r.input, r.reference) for r in rows] == [("what is up", "the sky"), ("how are you", "fine")]
    assert rows[0].fields == {"query": "what is up", "answer": "the sky"}


def test_local_dataset_default_columns(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}", "output": f"o{i}", "id": i}) + "\n" for i in range(3)))
    rows = load_dataset_rows(str(path))
    assert [(r.input, r.reference) for r in rows] == [("t0", "o0"), ("t1", "o1"), ("t2", "o2")]


def test_local_parquet_folder(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "ds"
    folder.mkdir()
    pq.write_table(pa.table({"prompt": ["a", "b"]}), folder / "train.parquet")
    assert [r.input for r in load_dataset_rows(str(folder))] == ["a", "b"]


def test_missing_column_names_it_and_lists_the_others(local_csv):
    with pytest.raises(NotFoundError) as caught:
        load_dataset_rows(str(local_csv), column="prompt_text")
    assert "prompt_text" in caught.value.message
    assert caught.value.hint == "available columns: query, answer"
    with pytest.raises(NotFoundError, match="none of the columns"):
        load_dataset_rows(str(local_csv))  # no default column in it
    with pytest.raises(NotFoundError, match="'label'"):
        load_dataset_rows(str(local_csv), column="query", reference_column="label")


def test_missing_split_lists_the_splits(local_csv):
    with pytest.raises(NotFoundError) as caught:
        load_dataset_rows(str(local_csv), split="test", column="query")
    assert "'test'" in caught.value.message and caught.value.hint == "available splits: train"


def test_unreadable_local_file_type(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("x")
    with pytest.raises(UsageError, match="cannot read"):
        load_dataset_rows(str(path))


def test_hub_dataset_without_network_is_a_network_error(tmp_path):
    # in a fresh interpreter, so that HF_HUB_OFFLINE is read when `datasets` is imported
    code = (
        "from trtdeploy.perf.inputs import load_dataset_rows\n"
        "from trtdeploy.errors import NetworkError\n"
        "try:\n"
        "    load_dataset_rows('someone/some_dataset')\n"
        "except NetworkError as exc:\n"
        "    print('NETWORK', exc.message, '|', exc.hint)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.startswith("NETWORK cannot load dataset 'someone/some_dataset'"), done.stdout + done.stderr
    assert "pass a local path" in done.stdout
    assert NetworkError.exit_code == 7


@pytest.mark.parametrize("length", [1, 2, 3, 7, 16, 50, 130])
def test_synthetic_prompts_have_exactly_the_asked_token_count(tiny_tokenizer, length):
    tokenizer = load_tokenizer(tiny_tokenizer)
    prompts = synthetic_prompts(tokenizer, 6, length, seed=3)
    assert [len(tokenizer.encode(p, add_special_tokens=True)) for p in prompts] == [length] * 6
    assert len(set(prompts)) == 6


def test_synthetic_prompts_are_deterministic_by_seed(tiny_tokenizer):
    tokenizer = load_tokenizer(tiny_tokenizer)
    assert synthetic_prompts(tokenizer, 3, 12, seed=1) == synthetic_prompts(tokenizer, 3, 12, seed=1)
    assert synthetic_prompts(tokenizer, 3, 12, seed=1) != synthetic_prompts(tokenizer, 3, 12, seed=2)


def test_workload_synthetic_rows_carry_the_output_length(tiny_tokenizer):
    rows = TextLLMWorkload("ensemble", tiny_tokenizer).synthetic_rows(4, input_tokens=9, output_tokens=5, seed=0)
    assert len(rows) == 4 and all(row.max_tokens == 5 for row in rows)


def test_the_chat_template_counts_and_sizes_prompts_as_the_deployment_does(tmp_path):
    """A deployment built with -o chat_template=true wraps each prompt in the template: the input tokens perf
    reports, and --isl, are the tokens the engine sees, template included."""
    from trtdeploy.checkpoints import write_bpe_tokenizer

    write_bpe_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    plain = TextLLMWorkload("ensemble", tmp_path)
    chat = TextLLMWorkload("ensemble", tmp_path, chat_template=True)
    text = "the quick brown fox"
    wrapped = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True
    )
    wrapped = wrapped["input_ids"] if hasattr(wrapped, "keys") else wrapped
    assert chat.prompt_ids(text) == list(wrapped)
    assert len(chat.prompt_ids(text)) > len(plain.prompt_ids(text)) + 5  # the template's tokens are counted
    rows = chat.synthetic_rows(4, input_tokens=40, output_tokens=8, seed=0)
    assert [len(chat.prompt_ids(row.input)) for row in rows] == [40] * 4
    with pytest.raises(UsageError, match="--isl 3 is too short for this model: its preprocessing .* adds"):
        chat.synthetic_rows(1, input_tokens=3, output_tokens=8, seed=0)


def test_a_dataset_file_that_cannot_be_parsed_is_a_one_line_error(tmp_path):
    path = _write(tmp_path / "rows.jsonl", ['{"input": "fine"}', '{"input": "half a pair \\ud83d here"}'])
    with pytest.raises(UsageError, match="cannot read dataset .*: JSON parse error: The surrogate pair") as caught:
        load_dataset_rows(str(path))
    assert "\n" not in caught.value.message


def test_synthetic_prompts_take_a_length_each(tiny_tokenizer):
    tokenizer = load_tokenizer(tiny_tokenizer)
    prompts = synthetic_prompts(tokenizer, 4, [3, 9, 1, 20], seed=3)
    assert [len(tokenizer.encode(p, add_special_tokens=True)) for p in prompts] == [3, 9, 1, 20]


def test_synthetic_lengths_are_drawn_around_isl_and_osl_within_the_deployments_limits(tiny_tokenizer):
    import numpy as np

    workload = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer)
    rows = InputSpec(isl=40, osl=20, isl_stddev=8, osl_stddev=4, caps=(1000, 1000)).synthetic_rows(
        workload, 0, 300, seed=0
    )
    inputs = np.array([len(workload.prompt_ids(row.input)) for row in rows])
    outputs = np.array([row.max_tokens for row in rows])
    assert len(rows) == 300 and abs(inputs.mean() - 40) < 1.5 and abs(inputs.std() - 8) < 1.5
    assert abs(outputs.mean() - 20) < 1 and abs(outputs.std() - 4) < 1
    capped = InputSpec(isl=40, osl=20, isl_stddev=8, osl_stddev=4, caps=(44, 22)).synthetic_rows(
        workload, 0, 300, seed=0
    )
    assert max(len(workload.prompt_ids(row.input)) for row in capped) == 44
    assert max(row.max_tokens for row in capped) == 22 and min(row.max_tokens for row in capped) >= 1
    steady = InputSpec(isl=40, osl=20).synthetic_rows(workload, 0, 300, seed=0)
    assert {len(workload.prompt_ids(row.input)) for row in steady} == {40}
    assert {row.max_tokens for row in steady} == {20}


def test_synthetic_rows_made_a_block_at_a_time_are_the_rows_made_at_once(tiny_tokenizer):
    """A run makes its synthetic rows as its levels need them: the same rows, lengths drawn included."""
    workload = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer)
    spec = InputSpec(isl=12, osl=6, isl_stddev=3, osl_stddev=2, caps=(1000, 1000))
    at_once = spec.synthetic_rows(workload, 0, 9, seed=4)
    in_blocks = [
        row for start, count in ((0, 2), (2, 5), (7, 2)) for row in spec.synthetic_rows(workload, start, count, seed=4)
    ]
    assert in_blocks == at_once and len({row.input for row in at_once}) == 9


def test_drawn_prompts_keep_a_token_beyond_what_the_chat_template_adds(tmp_path):
    from trtdeploy.checkpoints import write_bpe_tokenizer

    write_bpe_tokenizer(tmp_path)  # with Qwen's chat template
    workload = TextLLMWorkload("text_llm", tmp_path, chat_template=True)
    overhead = len(workload.prompt_ids(""))
    rows = InputSpec(isl=overhead + 4, isl_stddev=8, caps=(1000, 1000)).synthetic_rows(workload, 0, 60, seed=0)
    lengths = [len(workload.prompt_ids(row.input)) for row in rows]
    assert overhead > 0 and min(lengths) == overhead + 1 and max(lengths) > overhead + 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"isl_stddev": -1.0}, "--isl-stddev must be >= 0"),
        ({"osl_stddev": 3.0}, "--osl-stddev varies the output length around --osl"),
        ({"isl_stddev": 3.0, "dataset": "some/data"}, "--isl-stddev and --osl-stddev vary synthetic prompts"),
    ],
)
def test_length_spreads_are_checked(kwargs, message):
    with pytest.raises(UsageError, match=message):
        InputSpec(**kwargs)


def chat_workload(folder: Path) -> TextLLMWorkload:
    """A text workload whose tokenizer has Qwen's chat template: the model sees the template's tokens before and
    after every prompt."""
    from trtdeploy.checkpoints import write_bpe_tokenizer

    write_bpe_tokenizer(folder)
    return TextLLMWorkload("ensemble", folder, chat_template=True)


@pytest.fixture(params=["plain", "chat"])
def llm_workload(request, tiny_tokenizer, tmp_path):
    """A token-contract workload over the tiny tokenizer (which adds nothing to a prompt), or a chat one."""
    return TokenLLMWorkload("tensorrt_llm", tiny_tokenizer) if request.param == "plain" else chat_workload(tmp_path)


def test_shared_prefix_prompts_share_their_first_tokens_within_a_group(llm_workload):
    """Row i starts with prefix i mod 3: the first prefix_len tokens the model sees (those the deployment puts
    before the prompt, then the prefix's) are its group's; the rest is its own; every prompt is prefix + isl."""
    spec = InputSpec(isl=24, osl=5, shared_prefixes=3, prefix_len=16, caps=(1000, 1000))
    rows = spec.synthetic_rows(llm_workload, 0, 12, seed=2)
    ids = [llm_workload.prompt_ids(row.input) for row in rows]
    assert {len(prompt) for prompt in ids} == {16 + 24} and {row.max_tokens for row in rows} == {5}
    for group in range(3):
        members = ids[group::3]
        assert len({tuple(prompt[:16]) for prompt in members}) == 1
        assert len({tuple(prompt[16:]) for prompt in members}) == len(members)
    assert len({tuple(prompt[:16]) for prompt in ids[:3]}) == 3  # three different prefixes
    in_blocks = spec.synthetic_rows(llm_workload, 0, 5, seed=2) + spec.synthetic_rows(llm_workload, 5, 7, seed=2)
    assert in_blocks == rows  # made as the levels need them: the same rows
    assert spec.synthetic_rows(llm_workload, 0, 12, seed=3) != rows
    assert spec.describe() == "synthetic isl=24, 3 shared prefixes of 16 tokens before them"


def test_a_shared_prefix_leaves_a_token_of_the_prompts_own(tmp_path):
    """--isl counts what the deployment adds (16 template tokens here): a prompt needs one more of its own."""
    workload = chat_workload(tmp_path)
    overhead = len(workload.prompt_ids(""))
    spec = InputSpec(isl=overhead, osl=5, shared_prefixes=2, prefix_len=8, caps=(1000, 1000))
    with pytest.raises(UsageError, match=f"adds {overhead} tokens to every prompt") as caught:
        spec.synthetic_rows(workload, 0, 2, seed=0)
    assert overhead > 1 and caught.value.hint == f"pass --isl {overhead + 1} or more"
    rows = replace(spec, isl=overhead + 1).synthetic_rows(workload, 0, 2, seed=0)
    assert [len(workload.prompt_ids(row.input)) for row in rows] == [8 + overhead + 1] * 2


def test_speech_workloads_have_no_prompts_of_blocks():
    from trtdeploy.perf.tts import TTSWorkload

    spec = InputSpec(isl=8, shared_prefixes=2, prefix_len=4)
    workload = TTSWorkload("spark_tts", decoupled=True, sample_rate=16000, tokens_per_second=50)
    with pytest.raises(UsageError, match="the TTSWorkload workload has no prompts of token blocks"):
        spec.synthetic_rows(workload, 0, 2, seed=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shared_prefixes": 2}, "--shared-prefixes N and --prefix-len P go together"),
        ({"prefix_len": 8}, "--shared-prefixes N and --prefix-len P go together"),
        ({"shared_prefixes": -1, "prefix_len": 8}, "--shared-prefixes must be >= 0"),
        ({"shared_prefixes": 2, "prefix_len": 0}, "--prefix-len must be >= 1, got 0"),
        ({"shared_prefixes": 2, "prefix_len": 8, "dataset": "some/data"}, "--shared-prefixes makes synthetic"),
        ({"shared_prefixes": 2, "prefix_len": 8, "isl_stddev": 4.0}, "--isl-stddev varies plain synthetic prompts"),
        ({"osl_from_reference": True}, "--osl-from-reference takes the output lengths from the references"),
        ({"osl_from_reference": True, "dataset": "d", "osl": 5}, "--osl-from-reference sets each request's output"),
    ],
)
def test_prefix_and_reference_options_are_checked(kwargs, message):
    with pytest.raises(UsageError, match=message):
        InputSpec(**kwargs)
