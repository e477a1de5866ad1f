"""Triton python model: text → token ids, word lists and embedding bias for the LLM contract.

As tensorrtllm_backend's ``preprocessing`` does it (same tensors, same semantics): each row of the batch is tokenized;
``stop_words``/``bad_words`` become TensorRT-LLM's word-list layout ``[2, n]`` (each word tokenized without special
tokens, empty words dropped, ids padded with 0 and end offsets with -1), absent ones ``[2, 0]``;
``embedding_bias_words``/``_weights`` become a per-token bias over the model's vocabulary (each weight added to every
token of its word). Every other input it is given is one the deployment's engine does not take: a value other than
the neutral one (false, 0, empty) is refused, naming the input and the engine.

A request that names no ``end_id`` ends at the tokenizer's EOS and, as stop words (kept in the output, as TensorRT-LLM
keeps them), at the model's other end tokens: those of ``generation_config.json`` (Llama 3 Instruct's
``<|eot_id|>`` and ``<|end_of_text|>``) and the ``end_tokens`` of the model's spec.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

from trtdeploy.backend_utils import ModelParameters

#: The inputs this model itself reads (ensemble names in the comments of templates/ensemble).
OWN_INPUTS = frozenset(
    {
        "QUERY",
        "DECODER_QUERY",
        "REQUEST_OUTPUT_LEN",
        "END_ID",
        "PAD_ID",
        "STOP_WORDS_DICT",
        "BAD_WORDS_DICT",
        "EMBEDDING_BIAS_WORDS",
        "EMBEDDING_BIAS_WEIGHTS",
        "PROMPT_TABLE_EXTRA_ID",
    }
)


def _neutral(values: np.ndarray) -> bool:
    """Whether an input asks for nothing: empty, false, 0 or empty strings throughout."""
    if values.dtype == object:
        return all(not value for value in values.reshape(-1))
    return not np.any(values)


def _texts(values: np.ndarray, name: str) -> list[str]:
    texts = []
    for value in values.reshape(-1):
        try:
            texts.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{name} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    return texts


class TritonPythonModel:
    def initialize(self, args):
        params = ModelParameters(args)
        tokenizer_dir = params.str("tokenizer_dir")
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
        self.max_input_len = params.int("max_input_len")
        self.max_output_len = params.int("max_output_len")
        self.chat_template = params.bool("chat_template", False)
        self.add_special_tokens = params.bool("add_special_tokens", True)
        self.engine = params.str("engine")
        self.end_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end_id
        config = json.loads((Path(tokenizer_dir) / "config.json").read_text())
        self.vocab_size = max(len(self.tokenizer), int(config.get("vocab_size") or 0))
        self.other_end_ids = self._other_end_ids(Path(tokenizer_dir), json.loads(params.str("end_tokens")))

    def _other_end_ids(self, folder, end_tokens):
        """The ids that end an answer besides EOS: generation_config.json's and the spec's ``end_tokens``."""
        found = set()
        generation = folder / "generation_config.json"
        if generation.is_file():
            ends = json.loads(generation.read_text()).get("eos_token_id")
            found.update(ends if isinstance(ends, list) else [] if ends is None else [ends])
        for token in end_tokens:
            token_id = self.tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == self.tokenizer.unk_token_id:
                raise ValueError(f"end token {token!r} is not in the tokenizer of {folder}")
            found.add(token_id)
        return sorted(found - {self.end_id})

    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._prepare(inputs)))
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses

    def _prepare(self, inputs):
        self._refuse_what_the_engine_does_not_take(inputs)
        texts = _texts(inputs["QUERY"], "text_input")
        rows = len(texts)
        ids = [self._tokenize(text) for text in texts]
        output_len = inputs["REQUEST_OUTPUT_LEN"].reshape(rows, -1)[:, :1]
        for value in output_len.reshape(-1).tolist():
            if value < 1:
                raise ValueError(f"max_tokens must be >= 1, got {value}")
            if value > self.max_output_len:
                raise ValueError(
                    f"max_tokens={value} is more than this deployment's max_output_len={self.max_output_len}"
                )
        longest = max(len(row) for row in ids)
        input_ids = np.full((rows, longest), self.pad_id, dtype=np.int32)
        for row, tokens in enumerate(ids):
            input_ids[row, : len(tokens)] = tokens

        def per_row(name, default):
            values = inputs.get(name)
            return np.full((rows, 1), default, np.int32) if values is None else values.reshape(rows, 1).astype(np.int32)

        # the model's other end tokens, unless the request names its end (-1 for none: exact lengths)
        end_words = [[token] for token in self.other_end_ids] if "END_ID" not in inputs else []
        stop_words = self._word_lists(inputs.get("STOP_WORDS_DICT"), rows, "stop_words", end_words)
        return [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([[len(row)] for row in ids], dtype=np.int32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN_OUT", output_len.astype(np.int32)),
            pb_utils.Tensor("OUT_END_ID", per_row("END_ID", self.end_id)),
            pb_utils.Tensor("OUT_PAD_ID", per_row("PAD_ID", self.pad_id)),
            pb_utils.Tensor("STOP_WORDS_IDS", stop_words),
            pb_utils.Tensor("BAD_WORDS_IDS", self._word_lists(inputs.get("BAD_WORDS_DICT"), rows, "bad_words")),
            pb_utils.Tensor("EMBEDDING_BIAS", self._embedding_bias(inputs, rows)),
        ]

    def _refuse_what_the_engine_does_not_take(self, inputs):
        decoder = inputs.get("DECODER_QUERY")
        if decoder is not None and not _neutral(decoder):
            raise ValueError("decoder_text_input: this model is decoder-only (it takes no decoder input)")
        extra_id = inputs.get("PROMPT_TABLE_EXTRA_ID")
        if extra_id is not None and not _neutral(extra_id):
            raise ValueError(
                f"prompt_table_extra_id: the {self.engine} engine of this deployment takes no prompt table"
            )
        refused = sorted(name for name, values in inputs.items() if name not in OWN_INPUTS and not _neutral(values))
        if refused:
            raise ValueError(
                f"{', '.join(refused)}: the {self.engine} engine of this deployment does not take "
                f"{'them' if len(refused) > 1 else 'it'} (leave {'them' if len(refused) > 1 else 'it'} out, or send "
                "empty, 0 or false)"
            )

    def _tokenize(self, text):
        if not text:
            raise ValueError("text_input is empty")
        if self.chat_template:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True
            )
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        else:
            ids = self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"]
        if len(ids) > self.max_input_len:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than max_input_len={self.max_input_len}")
        return ids

    def _word_lists(self, values, rows, name, extra=()):
        """TensorRT-LLM's ``[rows, 2, n]`` word lists of ``values`` (``[rows, words]`` strings) and the ``extra``
        words (token ids) of every row, or ``[rows, 2, 0]`` when there are none."""
        if values is None and not extra:
            return np.zeros((rows, 2, 0), dtype=np.int32)
        lists = []
        for words in np.empty((rows, 0), dtype=object) if values is None else values.reshape(rows, -1):
            encoded = [self.tokenizer.encode(word, add_special_tokens=False) for word in _texts(words, name)]
            encoded = [word for word in encoded if word] + list(extra)
            lists.append(([token for word in encoded for token in word], np.cumsum([len(word) for word in encoded])))
        width = max(1, max(len(flat) for flat, _ in lists))
        array = np.zeros((rows, 2, width), dtype=np.int32)
        array[:, 1, :] = -1
        for row, (flat, ends) in enumerate(lists):
            array[row, 0, : len(flat)] = flat
            array[row, 1, : len(ends)] = ends
        return array

    def _embedding_bias(self, inputs, rows):
        """``[rows, vocab]`` biases, or ``[rows, 0]`` when the request sends no bias words."""
        words, weights = inputs.get("EMBEDDING_BIAS_WORDS"), inputs.get("EMBEDDING_BIAS_WEIGHTS")
        counts = [0 if values is None else values.size for values in (words, weights)]
        if counts == [0, 0]:
            return np.zeros((rows, 0), dtype=np.float32)
        if counts[0] != counts[1]:
            raise ValueError(
                f"embedding_bias_words has {counts[0]} words and embedding_bias_weights {counts[1]} weights: give "
                "one weight per word"
            )
        bias = np.zeros((rows, self.vocab_size), dtype=np.float32)
        for row, (row_words, row_weights) in enumerate(
            zip(words.reshape(rows, -1), weights.reshape(rows, -1), strict=True)
        ):
            for word, weight in zip(_texts(row_words, "embedding_bias_words"), row_weights.tolist(), strict=True):
                for token in self.tokenizer.encode(word, add_special_tokens=False):
                    bias[row, token] += weight
        return bias
