"""``whisper_bls`` and ``whisper_bls_offline``: the BLS model that turns 16 kHz speech into text.

Per utterance (a row of ``WAV``, cut to its ``WAV_LENS``): consecutive windows of up to 30 s, each its log-mel
features (:mod:`.audio`) and one request to the LLM contract (``tensorrt_llm``) with TensorRT-LLM's
encoder-decoder tensors and the decoder prompt of ``TEXT_PREFIX`` (:mod:`.tokens`); the windows' transcripts are
joined with a space.

Offline, the windows of every utterance of every request in the batch go to the LLM at once (``async_exec``), and
each request gets one response. Decoupled (streaming), windows go one after another, and each window's tokens are
asked for in growing segments (``stream_first_tokens``, then ``stream_growth`` times the segment before, up to the
window's token cap): non-decoupled requests whose decoder prompt is the request's followed by the tokens generated
so far in the window. Whenever the text grows, the request gets a response holding the whole transcript so far, as
the official ``whisper_bls`` sends it, then an empty final response. The official BLS reads the LLM's token stream
instead (``exec(decoupled=True)``), which crashed tritonserver 2.51's python backend under concurrent streams on a
GPU host (see the README). Greedy decoding gives the same tokens either way; each segment runs the encoder again.

Every failure reaches the client as an error response naming the problem; the model keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from trtdeploy import ModelParameters, RequestError, bls_request, error_response, first_sequence

from .audio import SAMPLE_RATE, WINDOW_FRAMES, AudioError, LogMel, utterances, windows
from .tokens import PromptError, WhisperText

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
LLM_OUTPUTS = ["output_ids", "sequence_length"]


@dataclass
class Transcription:
    """One parsed request: its utterances and, per utterance, the decoder prompt and the token cap per window."""

    utterances: list[np.ndarray]
    prompts: list[np.ndarray]
    max_new_tokens: list[int]
    ignore_eos: list[bool]
    #: The request's Triton trace, which its calls to the LLM carry on.
    trace: Any = None


def _transcripts(texts: list[str]) -> pb_utils.InferenceResponse:
    array = np.array([[text.encode("utf-8")] for text in texts], dtype=np.object_)
    return pb_utils.InferenceResponse([pb_utils.Tensor("TRANSCRIPTS", array)])


def _rows(request, name: str, rows: int, default) -> list:
    """One value per row of an optional ``[N, 1]`` input (one value serves every row); ``default`` when not sent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return [default] * rows
    values = tensor.as_numpy().reshape(-1).tolist()
    if len(values) == 1:
        return values * rows
    if len(values) != rows:
        raise RequestError(f"{name} has {len(values)} values for {rows} rows of WAV")
    return values


def _scalar(name: str, value, dtype) -> pb_utils.Tensor:
    return pb_utils.Tensor(name, np.array([[value]], dtype=dtype))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.llm_model = params.str("llm_model")
        checkpoint = Path(params.str("checkpoint_dir"))
        # each instance serves one request (or dynamic batch) at a time, and a deployment runs as many instances as
        # its batch size: a torch thread pool per instance (the features' STFT) would oversubscribe the cores
        torch.set_num_threads(1)
        self.text = WhisperText(checkpoint / "tokenizer.json", language=params.str("language"), task=params.str("task"))
        self.log_mel = LogMel(checkpoint, params.str("encoder_features_dtype"))
        self.max_input_len = params.int("max_input_len")
        self.max_output_len = params.int("max_output_len")
        self.max_new_tokens = params.int("max_new_tokens")
        self.window_samples = round(params.float("window_seconds") * SAMPLE_RATE)
        self.max_samples = round(params.float("max_audio_seconds") * SAMPLE_RATE)
        self.stream_first_tokens = params.int("stream_first_tokens")
        self.stream_growth = params.float("stream_growth")

    def execute(self, requests: list):
        if self.decoupled:
            for request in requests:
                self._stream(request, request.get_response_sender())
            return None
        return self._answer_all(requests)  # a coroutine: the python backend runs it to completion

    # --- reading a request ------------------------------------------------------------------------------------

    def _parse(self, request) -> Transcription:
        wav = pb_utils.get_input_tensor_by_name(request, "WAV")
        if wav is None:
            raise RequestError("input 'WAV' is missing: send 16 kHz mono samples as FP32 [1, samples]")
        wav = wav.as_numpy()
        wav = wav.reshape(1, -1) if wav.ndim == 1 else wav
        rows = wav.shape[0]
        for rate in _rows(request, "SAMPLE_RATE", rows, SAMPLE_RATE):
            if rate != SAMPLE_RATE:
                raise RequestError(f"WAV must be {SAMPLE_RATE} Hz mono, got SAMPLE_RATE {rate}: resample it first")
        lengths = pb_utils.get_input_tensor_by_name(request, "WAV_LENS")
        try:
            found = utterances(wav, None if lengths is None else lengths.as_numpy(), self.max_samples)
        except AudioError as exc:
            raise RequestError(str(exc)) from None
        prompts = [self._prompt(prefix) for prefix in _rows(request, "TEXT_PREFIX", rows, b"")]
        caps = [int(cap) for cap in _rows(request, "MAX_NEW_TOKENS", rows, self.max_new_tokens)]
        for cap in caps:
            if not 0 < cap <= self.max_output_len:
                raise RequestError(
                    f"MAX_NEW_TOKENS {cap} is outside 1..{self.max_output_len} (this deployment's max_output_len)"
                )
        ignore_eos = [bool(flag) for flag in _rows(request, "IGNORE_EOS", rows, False)]
        return Transcription(found, prompts, caps, ignore_eos, trace=request.trace())

    def _prompt(self, prefix) -> np.ndarray:
        try:
            text = prefix.decode("utf-8") if isinstance(prefix, bytes) else str(prefix)
        except UnicodeDecodeError as exc:
            raise RequestError(f"TEXT_PREFIX is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        try:
            ids = self.text.prompt_ids(text)
        except PromptError as exc:
            raise RequestError(str(exc)) from None
        if ids.size > self.max_input_len:
            raise RequestError(
                f"TEXT_PREFIX is {ids.size} tokens, more than this deployment's max_input_len {self.max_input_len}: "
                "shorten its <|startofprev|> text prompt, or rebuild with a larger --max-input-len"
            )
        return ids

    def _llm_inputs(self, features: np.ndarray, job: Transcription, row: int, said: list[int], wanted: int) -> list:
        """The official whisper_bls's request to the LLM for one window of utterance ``row`` (its log-mel
        ``features``): ``wanted`` more tokens after the prompt and the window's tokens ``said`` so far."""
        prompt = job.prompts[row]
        return [
            pb_utils.Tensor("encoder_input_features", features),
            _scalar("encoder_output_lengths", WINDOW_FRAMES // 2, np.int32),
            _scalar("input_lengths", WINDOW_FRAMES, np.int32),
            pb_utils.Tensor("decoder_input_ids", np.concatenate([prompt, np.asarray(said, prompt.dtype)])[None]),
            _scalar("request_output_len", wanted, np.int32),
            _scalar("end_id", self._end_id(job, row), np.int32),
            _scalar("pad_id", self.text.end_id, np.int32),
            _scalar("streaming", False, np.bool_),
        ]

    def _end_id(self, job: Transcription, row: int) -> int:
        return -1 if job.ignore_eos[row] else self.text.end_id  # -1: never stop early

    def _llm_request(self, job: Transcription, inputs: list) -> pb_utils.InferenceRequest:
        return bls_request(self.llm_model, inputs, LLM_OUTPUTS, job.trace)

    # --- offline: every window of the batch at once -----------------------------------------------------------

    async def _answer_all(self, requests: list) -> list:
        return list(await asyncio.gather(*(self._answer(request) for request in requests)))

    async def _answer(self, request) -> pb_utils.InferenceResponse:
        try:
            job = self._parse(request)
            texts = await asyncio.gather(
                *(self._transcribe(job, row) for row in range(len(job.utterances)))
            )  # fmt: skip
            return _transcripts(list(texts))
        except RequestError as exc:
            return error_response(str(exc), invalid=True)
        except Exception as exc:  # anything else is the server's fault; the model keeps serving
            return error_response(f"whisper_bls failed: {type(exc).__name__}: {exc}", invalid=False)

    async def _transcribe(self, job: Transcription, row: int) -> str:
        parts = windows(job.utterances[row], self.window_samples)
        texts = await asyncio.gather(*(self._window_text(job, row, window) for window in parts))
        return " ".join(text for text in texts if text)

    async def _window_text(self, job: Transcription, row: int, window: np.ndarray) -> str:
        inputs = self._llm_inputs(self.log_mel(window), job, row, [], job.max_new_tokens[row])
        response = await self._llm_request(job, inputs).async_exec()
        return self.text.transcript(self._new_ids(response))

    def _new_ids(self, response) -> list[int]:
        """The generated ids of one LLM response."""
        if response.has_error():
            raise RuntimeError(f"{self.llm_model}: {response.error().message()}")
        output = pb_utils.get_output_tensor_by_name(response, "output_ids").as_numpy()
        lengths = pb_utils.get_output_tensor_by_name(response, "sequence_length")
        return first_sequence(output, None if lengths is None else lengths.as_numpy()).tolist()

    # --- streaming: window after window, each window's tokens in growing segments ------------------------------

    def _segments(self, job: Transcription, row: int, window: np.ndarray) -> Iterator[list[int]]:
        """Ask the LLM for the window's tokens a segment at a time (one non-decoupled request each, the prompt
        followed by the tokens so far); yields the window's ids after each segment. Greedy decoding makes them the
        ids of one request for the whole window."""
        features = self.log_mel(window)
        end_id = self._end_id(job, row)
        said: list[int] = []
        size = self.stream_first_tokens
        while len(said) < job.max_new_tokens[row]:
            wanted = min(size, job.max_new_tokens[row] - len(said))
            new = self._new_ids(self._llm_request(job, self._llm_inputs(features, job, row, said, wanted)).exec())
            said.extend(new)
            yield said
            if len(new) < wanted or end_id in new:  # the window's end token (kept in the output by some engines)
                return
            size = int(size * self.stream_growth)

    def _stream(self, request, sender) -> None:
        try:
            job = self._parse(request)
        except RequestError as exc:
            sender.send(error_response(str(exc), invalid=True), flags=FINAL)
            return
        try:
            texts = [""] * len(job.utterances)
            sent = False
            for row, samples in enumerate(job.utterances):
                done = ""
                for window in windows(samples, self.window_samples):
                    for ids in self._segments(job, row, window):
                        text = " ".join(part for part in (done, self.text.transcript(ids)) if part)
                        if text != texts[row]:
                            texts[row] = text
                            sender.send(_transcripts(texts))
                            sent = True
                        if sender.is_cancelled():  # the client is gone: nothing more to transcribe or send
                            sender.send(flags=FINAL)
                            return
                    done = texts[row]
            if not sent:  # official clients read the last response: send the (empty) transcript once
                sender.send(_transcripts(texts))
            sender.send(flags=FINAL)
        except Exception as exc:  # the model keeps serving
            sender.send(error_response(f"whisper_bls failed: {type(exc).__name__}: {exc}", invalid=False), flags=FINAL)
