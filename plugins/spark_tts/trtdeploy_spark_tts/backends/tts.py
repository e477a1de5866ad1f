"""``spark_tts`` and ``spark_tts_offline``: the BLS model that turns a reference voice and a text into speech.

Per request: ``audio_tokenizer`` (reference → global + semantic tokens), the official prompt, the LLM contract
(``tensorrt_llm``, whichever engine serves it), the semantic tokens of its answer, ``vocoder``. Offline, one
waveform comes back; decoupled (streaming), audio chunks as they are made (see ``streaming.py``), then an empty
final response.

Every call is non-decoupled. Streaming asks the LLM for one chunk's tokens at a time, with the prompt followed by
what it said so far: BLS models reading a decoupled model's token stream (``exec(decoupled=True)``) segfault in
the python-backend stub under concurrent load on GPU hosts (tritonserver 2.51; upstream server#8882, #8922). Each
segment re-reads the prompt (a prefill of a few hundred to a few thousand tokens, a few ms on a GPU); with the
torch engine a seeded request draws the same tokens as in one call (its sampling noise depends on the position).
On the TensorRT-LLM engines each request restarts its seed's noise, so each segment gets its own seed
(:func:`~trtdeploy.backend_utils.segment_seed`); otherwise every segment would replay the first one's noise.

Streamed audio goes out in the request's ``stream_format`` (the deployment's by default): ``overlapped``, the
official wire format that the official clients cross-fade, or ``finished`` chunks (see ``streaming.py``).

Each instance serves one request at a time (the deployment runs as many instances as requests it serves at once):
BLS calls made from several threads of one python-backend process were seen to hang it on a GPU host. Every
failure reaches the client as an error response naming the problem; the model keeps serving.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy import (
    ModelParameters,
    RequestError,
    Sampling,
    call_model,
    decode_text,
    error_response,
    generate_segment,
    has_input,
    optional_scalar,
    read_sampling,
    reference_wav,
    row_tensor,
)

from ..prompt import SAMPLE_RATE, SAMPLES_PER_TOKEN, TOKENS_PER_SECOND, PromptCodec, semantic_tokens_for
from ..streaming import STREAM_FORMATS, AudioStream, ChunkSchedule, OverlappedChunks, StreamFormat

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@dataclass
class Synthesis:
    """One parsed request."""

    wav: np.ndarray
    reference_text: str
    target_text: str
    max_tokens: int
    sampling: Sampling
    seed: int | None
    stream_format: StreamFormat
    #: The request's Triton trace, which its calls carry on.
    trace: Any = None


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.llm_model = params.str("llm_model")
        self.llm_seed_input = params.str("llm_seed_input")  # random_seed, or seed with TRT-LLM 0.20+
        self.seed_per_segment = not params.bool("llm_noise_keyed_by_position")
        self.stream_format = params.str("stream_format")
        self.max_input_len = params.int("max_input_len")
        self.max_output_len = params.int("max_output_len")
        self.max_reference_samples = int(params.float("max_reference_seconds") * SAMPLE_RATE)
        self.defaults = {
            "max_tokens": params.int("max_new_tokens"),
            "temperature": params.float("temperature"),
            "top_k": params.int("top_k"),
            "top_p": params.float("top_p"),
            "repetition_penalty": params.float("repetition_penalty"),
        }
        self.codec = PromptCodec.load(params.str("llm_tokenizer_dir"))
        context, lookahead = params.int("vocoder_context_tokens"), params.int("vocoder_lookahead_tokens")
        if min(context, lookahead) < 0:  # auto: the vocoder's receptive radius (the audio then is whole-utterance's)
            from trtdeploy_spark_tts.bicodec import BiCodecConfig, vocoder_receptive_radius

            radius = vocoder_receptive_radius(BiCodecConfig.from_yaml(f"{params.str('bicodec_dir')}/config.yaml"))
            context, lookahead = (radius if value < 0 else value for value in (context, lookahead))
        self.schedule = ChunkSchedule(
            first_tokens=round(params.float("chunk_seconds") * TOKENS_PER_SECOND),
            growth=params.float("chunk_growth"),
            max_tokens=round(params.float("max_chunk_seconds") * TOKENS_PER_SECOND),
            overlap_tokens=round(params.float("chunk_overlap_seconds") * TOKENS_PER_SECOND),
            context_tokens=context,
            lookahead_tokens=lookahead,
        )
        self.overlap_samples = self.schedule.overlap_tokens * SAMPLES_PER_TOKEN

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = self._parse(request)
            except RequestError as exc:
                sender.send(error_response(str(exc), invalid=True), flags=FINAL)
                continue
            self._serve(job, sender)
        return None

    # --- reading a request ------------------------------------------------------------------------------------

    def _parse(self, request) -> Synthesis:
        try:
            reference_text = decode_text(request, "reference_text")
            target_text = decode_text(request, "target_text")
        except ValueError as exc:
            hint = " (send the reference audio's transcript; an empty one clones from the audio alone)"
            raise RequestError(f"{exc}{hint if 'reference_text' in str(exc) else ''}") from None
        if not target_text.strip():
            raise RequestError("target_text is empty: there is nothing to say")
        sample_rate = optional_scalar(request, "sample_rate", SAMPLE_RATE)
        if sample_rate != SAMPLE_RATE:
            raise RequestError(f"reference_wav must be {SAMPLE_RATE} Hz mono, got {sample_rate} Hz: resample it first")
        try:
            wav = reference_wav(request, self.max_reference_samples, SAMPLE_RATE)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        max_tokens = int(optional_scalar(request, "max_tokens", self.defaults["max_tokens"]))
        if not 0 < max_tokens <= self.max_output_len:
            raise RequestError(
                f"max_tokens {max_tokens} is outside 1..{self.max_output_len} (this deployment's max_output_len)"
            )
        seed = optional_scalar(request, "random_seed")
        stream_format = decode_text(request, "stream_format") if has_input(request, "stream_format") else None
        if stream_format is not None and stream_format not in STREAM_FORMATS:
            raise RequestError(f"stream_format {stream_format!r} is neither {' nor '.join(STREAM_FORMATS)}")
        job = Synthesis(
            wav=wav,
            reference_text=reference_text,
            target_text=target_text,
            max_tokens=max_tokens,
            sampling=read_sampling(request, self.defaults),
            seed=None if seed is None else int(seed),
            stream_format=stream_format or self.stream_format,
            trace=request.trace(),
        )
        if self.decoupled and job.stream_format == "overlapped" and not self.overlap_samples:
            raise RequestError(
                "stream_format 'overlapped' needs chunks that overlap, and this deployment's chunk_overlap_seconds "
                "is 0: ask for stream_format 'finished', or rebuild with -o chunk_overlap_seconds=0.1"
            )
        return job

    # --- serving it --------------------------------------------------------------------------------------------

    def _serve(self, job: Synthesis, sender) -> None:
        try:
            global_codes, prompt = self._prompt(job)
            if self.decoupled:
                self._stream(job, global_codes, prompt, sender)
            else:
                codes = self.codec.semantic_codes(self._generate(job, prompt, job.max_tokens))
                if codes.size == 0:
                    raise RequestError(self._no_speech(job))
                audio = self._vocode(job, global_codes, codes)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio.reshape(1, -1))]), FINAL)
        except RequestError as exc:
            sender.send(error_response(str(exc), invalid=True), flags=FINAL)
        except Exception as exc:  # anything else is the server's fault; the model keeps serving
            sender.send(error_response(f"spark_tts failed: {type(exc).__name__}: {exc}", invalid=False), flags=FINAL)

    def _prompt(self, job: Synthesis) -> tuple[np.ndarray, np.ndarray]:
        """The reference's global tokens and the LLM prompt; RequestError when the prompt cannot fit."""
        with_transcript = bool(job.reference_text.strip())
        text_ids = self.codec.text_ids(job.reference_text if with_transcript else "", job.target_text)
        expected = semantic_tokens_for(job.wav.size) if with_transcript else None
        self._check_prompt_length(self.codec.prompt_length(text_ids, expected), expected or 0, job)
        response = call_model(
            "audio_tokenizer",
            [
                row_tensor("reference_wav", job.wav, np.float32),
                row_tensor("reference_wav_len", [job.wav.size], np.int32),
            ],
            ["global_tokens", "semantic_tokens"],
            job.trace,
        )
        global_codes = pb_utils.get_output_tensor_by_name(response, "global_tokens").as_numpy().reshape(-1)
        semantic = pb_utils.get_output_tensor_by_name(response, "semantic_tokens").as_numpy().reshape(-1)
        prompt = self.codec.prompt_ids(text_ids, global_codes, semantic if with_transcript else None)
        self._check_prompt_length(prompt.size, semantic.size if with_transcript else 0, job)
        return global_codes, prompt

    def _check_prompt_length(self, length: int, audio_tokens: int, job: Synthesis) -> None:
        """RequestError naming what to shorten when a prompt of ``length`` tokens (``audio_tokens`` of them the
        reference audio's) does not fit."""
        if length <= self.max_input_len:
            return
        seconds = job.wav.size / SAMPLE_RATE
        without_audio = length - audio_tokens
        if without_audio >= self.max_input_len:  # no length of reference audio would fit: the text is too long
            raise RequestError(
                f"the texts alone make a prompt of {without_audio} tokens, at least this deployment's max_input_len "
                f"{self.max_input_len}: shorten the target text (or split it across requests), or build with a "
                "larger --max-input-len"
            )
        room = (self.max_input_len - without_audio) / TOKENS_PER_SECOND
        raise RequestError(
            f"the prompt is {length} tokens ({seconds:.1f} s of reference audio at {TOKENS_PER_SECOND} tokens/s, "
            f"plus the texts), more than this deployment's max_input_len {self.max_input_len}: use at most "
            f"{room:.1f} s of reference audio or a shorter text, or build with a larger --max-input-len"
        )

    def _generate(self, job: Synthesis, prompt: np.ndarray, max_tokens: int, segment: int = 0) -> np.ndarray:
        """The ids the LLM generates after ``prompt``: ``max_tokens`` of them, fewer when it ends; ``segment``
        counts the calls of a streamed answer."""
        ids = generate_segment(
            self.llm_model,
            prompt,
            max_tokens,
            sampling=job.sampling,
            seed=job.seed,
            seed_input=self.llm_seed_input,
            segment=segment,
            seed_per_segment=self.seed_per_segment,
            extra=[
                row_tensor("end_id", [self.codec.eos_id], np.int32),
                row_tensor("pad_id", [self.codec.pad_id], np.int32),
            ],
            trace=job.trace,
        )
        return ids.astype(np.int32)

    def _stream(self, job: Synthesis, global_codes: np.ndarray, prompt: np.ndarray, sender) -> None:
        """Ask the LLM for the tokens of the next chunk, vocode, send; until it ends or the cap is reached."""
        stream = AudioStream(self.schedule, lambda chunk: self._vocode(job, global_codes, chunk))
        overlapped = OverlappedChunks(self.overlap_samples) if job.stream_format == "overlapped" else None

        def send(audio: np.ndarray) -> None:
            wire = overlapped.wire(audio) if overlapped else audio
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("waveform", wire.reshape(1, -1))]))

        said, left, segment = prompt, job.max_tokens, 0
        while left > 0 and not sender.is_cancelled():
            wanted = min(left, stream.tokens_until_next_chunk())
            ids = self._generate(job, said, wanted, segment)
            said, left, segment = np.concatenate([said, ids]), left - ids.size, segment + 1
            for audio in stream.push(self.codec.semantic_codes(ids)):
                send(audio)
            if ids.size < wanted:  # the LLM said its end token
                break
        if not stream.codes:
            raise RequestError(self._no_speech(job))
        rest = stream.finish()
        if rest is not None:
            send(rest)
        sender.send(flags=FINAL)

    def _vocode(self, job: Synthesis, global_codes: np.ndarray, codes: np.ndarray) -> np.ndarray:
        response = call_model(
            "vocoder",
            [row_tensor("global_tokens", global_codes, np.int32), row_tensor("semantic_tokens", codes, np.int32)],
            ["waveform"],
            job.trace,
        )
        return pb_utils.get_output_tensor_by_name(response, "waveform").as_numpy().reshape(-1)

    def _no_speech(self, job: Synthesis) -> str:
        return f"the LLM produced no semantic tokens in {job.max_tokens} tokens, so there is no audio"
