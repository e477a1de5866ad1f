"""``cosyvoice2`` / ``cosyvoice3`` (and ``*_offline``): the BLS model that turns a reference voice and a text into
24 kHz speech, with the official entry's tensors (``reference_wav``, ``reference_wav_len``, ``reference_text``,
``target_text`` → ``waveform``).

Per request: the voice (``reference_voice``: ``audio_tokenizer`` and ``speaker_embedding`` on the reference side by
side, its mel here; or a voice registered before, by ``speaker_id``), the prompt ``<|sos|>`` reference-text
target-text ``<|task_id|>`` reference-speech-tokens, the LLM contract (``tensorrt_llm``, whichever engine serves it)
with the speech-only ``embedding_bias``, then ``token2wav`` (CosyVoice3: and ``vocoder``). Offline, one waveform
comes back; decoupled (streaming), audio chunks as the speech tokens come, then an empty final response.

Every call is non-decoupled: streaming asks the LLM for one chunk's tokens at a time, with the prompt followed by
what it said so far (BLS models reading a decoupled model's stream crash the python-backend stub under load); with
``stream_overlap`` (the default), after the first chunk the LLM makes the next chunk's tokens while token2wav makes
the last one's audio. Each instance serves one request at a time. Every failure reaches the client as an error
response naming the problem; the model keeps serving.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from trtdeploy import (
    CallAhead,
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
    segment_seed,
)

from ..convert import SPEECH_BIAS_FILE, SpeechLayout
from ..prompt_mel import PromptMel, align
from ..speaker import MIN_SAMPLES as MIN_REFERENCE_SAMPLES
from ..speaker import SAMPLE_RATE as REFERENCE_RATE
from ..text import TextNormalizer
from ..voices import DEFAULT_SPEAKER, Voice, VoiceStore

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
#: CosyVoice3 was trained with a system text ending in this token before the reference text.
END_OF_PROMPT = "<|endofprompt|>"
SYSTEM_PROMPT = "You are a helpful assistant." + END_OF_PROMPT
#: Speech tokens after a streamed chunk that the flow reads ahead (its pre_lookahead_len).
LOOKAHEAD_TOKENS = 3


@dataclass
class Synthesis:
    """One parsed request."""

    target_text: str
    reference_text: str | None
    wav: np.ndarray | None
    speaker_id: str | None
    max_tokens: int
    sampling: Sampling
    seed: int | None
    #: LLM calls made for it so far (on TensorRT-LLM each gets a seed of its own, see generate_segment).
    llm_calls: int = 0
    #: The reference and target texts as the prompt reads them (normalised), once worked out.
    prompt_texts: tuple[str, str] | None = None
    #: The request's Triton trace, which its calls carry on.
    trace: Any = None


def _output(response, name: str) -> np.ndarray:
    return pb_utils.get_output_tensor_by_name(response, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.generation = params.str("generation")
        self.llm_model = params.str("llm_model")
        self.llm_seed_input = params.str("llm_seed_input")
        self.llm_min_tokens_input = params.str("llm_min_tokens_input")
        #: Whether the engine ends on every stop token of the converted LLM (its generation_config end tokens, all
        #: banned before min tokens) when a request sends no end_id: the torch engine. TensorRT-LLM's engines end on
        #: end_id alone, so the other stop tokens go as stop words (which min tokens does not hold back).
        self.llm_reads_end_tokens = params.bool("llm_reads_end_tokens")
        self.seed_per_segment = not params.bool("llm_noise_keyed_by_position")
        self.max_input_len = params.int("max_input_len")
        self.max_output_len = params.int("max_output_len")
        self.max_reference_samples = int(params.float("max_reference_seconds") * REFERENCE_RATE)
        self.min_ratio = params.float("min_token_text_ratio")
        self.max_ratio = params.float("max_token_text_ratio")
        self.defaults = {
            "max_tokens": params.int("max_new_tokens"),
            "temperature": params.float("temperature"),
            "top_k": params.int("top_k"),
            "top_p": params.float("top_p"),
            "repetition_penalty": params.float("repetition_penalty"),
        }
        self.first_chunk = params.int("first_chunk_tokens")
        self.chunk_growth = params.float("chunk_growth")
        self.max_chunk = params.int("max_chunk_tokens")
        self.stream_overlap = params.bool("stream_overlap")
        llm_dir = params.str("llm_dir")
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(f"{llm_dir}/tokenizer.json")
        self.layout = SpeechLayout.load(Path(llm_dir))
        self.bias = np.load(f"{llm_dir}/{SPEECH_BIAS_FILE}").astype(np.float32)
        #: The bias with every stop token masked as well, for the tokens before the minimum (see _generate).
        self.speaking_bias = self.bias.copy()
        self.speaking_bias[list(self.layout.stop_ids)] = -np.inf
        self.normalize = TextNormalizer() if params.bool("text_normalization") else None
        self.mel = PromptMel(fmax=8000.0 if self.generation == "cosyvoice2" else None)
        # the first request would otherwise load the grammars and the mel's libraries (about 1 s)
        if self.normalize is not None:
            self.normalize.load()
        self.mel.features(np.zeros(REFERENCE_RATE, dtype=np.float32))
        self.voices = VoiceStore(params.str("speaker_dir"))
        self.ahead = CallAhead()
        #: The prompt's text normalisation, on a thread of its own while this one computes the reference's mel.
        self.beside = CallAhead()

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
            target_text = decode_text(request, "target_text")
            reference_text = decode_text(request, "reference_text") if has_input(request, "reference_text") else None
            speaker_id = decode_text(request, "speaker_id") if has_input(request, "speaker_id") else None
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        if not target_text.strip():
            raise RequestError("target_text is empty: there is nothing to say")
        sample_rate = optional_scalar(request, "sample_rate", REFERENCE_RATE)
        if sample_rate != REFERENCE_RATE:
            raise RequestError(
                f"reference_wav must be {REFERENCE_RATE} Hz mono, got {sample_rate} Hz: resample it first"
            )
        wav = None
        if has_input(request, "reference_wav"):
            try:
                wav = reference_wav(request, self.max_reference_samples, REFERENCE_RATE)
            except ValueError as exc:
                raise RequestError(str(exc)) from None
            if wav.size < MIN_REFERENCE_SAMPLES:  # the speaker embedding needs that many: one clear error from here
                raise RequestError(
                    f"the reference audio is {wav.size} samples, too short for a speaker embedding: send at least "
                    f"{MIN_REFERENCE_SAMPLES} (a few seconds of speech make a good reference)"
                )
        if speaker_id is not None:
            try:
                self.voices.check_id(speaker_id)
            except ValueError as exc:
                raise RequestError(str(exc)) from None
        max_tokens = int(optional_scalar(request, "max_tokens", self.defaults["max_tokens"]))
        if not 0 < max_tokens <= self.max_output_len:
            raise RequestError(
                f"max_tokens {max_tokens} is outside 1..{self.max_output_len} (this deployment's max_output_len)"
            )
        seed = optional_scalar(request, "random_seed")
        job = Synthesis(
            target_text=target_text,
            reference_text=reference_text,
            wav=wav,
            speaker_id=speaker_id,
            max_tokens=max_tokens,
            sampling=read_sampling(request, self.defaults),
            seed=None if seed is None else int(seed),
            trace=request.trace(),
        )
        return job

    # --- serving it --------------------------------------------------------------------------------------------

    def _serve(self, job: Synthesis, sender) -> None:
        try:
            self._synthesize(job, sender)
        finally:
            self.ahead.drain()  # a BLS call still in flight when the request failed
            self.beside.drain()

    def _synthesize(self, job: Synthesis, sender) -> None:
        try:
            voice = self._voice(job)
            prompt, text_tokens = self._prompt(voice, job)
            min_tokens = int(self.min_ratio * text_tokens)
            max_tokens = max(1, min(job.max_tokens, int(self.max_ratio * text_tokens)))
            if self.decoupled:
                self._stream(job, voice, prompt, min_tokens, max_tokens, sender)
            else:
                tokens = self._speech_tokens(self._generate(job, prompt, max_tokens, min_tokens))
                if tokens.size == 0:
                    raise RequestError(self._no_speech(max_tokens))
                audio = self._audio_offline(job, voice, tokens)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio.reshape(1, -1))]), FINAL)
        except RequestError as exc:
            sender.send(error_response(str(exc), invalid=True), flags=FINAL)
        except Exception as exc:  # anything else is the server's fault; the model keeps serving
            sender.send(
                error_response(f"{self.generation} failed: {type(exc).__name__}: {exc}", invalid=False), flags=FINAL
            )

    def _voice(self, job: Synthesis) -> Voice:
        """The reference's voice (registered under ``speaker_id`` when one is given), or the registered one."""
        if job.wav is None:
            speaker_id = job.speaker_id or DEFAULT_SPEAKER
            try:
                return self.voices.load(speaker_id)
            except KeyError:
                raise RequestError(
                    f"no voice is registered as {speaker_id!r}: send reference_wav (and reference_text), with "
                    f"speaker_id {speaker_id!r} to register it"
                ) from None
        reference_text = job.reference_text or ""
        inputs = [
            row_tensor("reference_wav", job.wav, np.float32),
            row_tensor("reference_wav_len", [job.wav.size], np.int32),
        ]
        # the ensemble runs the tokenizer and the speaker embedding side by side; meanwhile, the reference's mel and
        # the prompt's texts are worked out here, each on a thread (numpy's FFT and wetext leave each other the GIL
        # part of the time)
        outputs = ["prompt_speech_tokens", "prompt_spk_embedding"]
        self.ahead.start(call_model, "reference_voice", inputs, outputs, job.trace)
        self.beside.start(self._prompt_texts, job, reference_text)
        features = self.mel.features(job.wav)
        self.beside.result()
        try:
            response = self.ahead.result()
        except RuntimeError as exc:
            raise RequestError(str(exc)) from None
        tokens, embedding = _output(response, "prompt_speech_tokens"), _output(response, "prompt_spk_embedding")
        tokens, mel = align(tokens.reshape(-1).astype(np.int32), features)
        if tokens.size == 0:
            raise RequestError("the reference audio is too short for one speech token (40 ms): send a few seconds")
        voice = Voice(text=reference_text, tokens=tokens, mel=mel, embedding=embedding.reshape(-1).astype(np.float32))
        if job.speaker_id is not None:
            self.voices.save(job.speaker_id, voice)
        return voice

    def _text(self, text: str) -> str:
        return self.normalize(text) if self.normalize is not None else text

    def _prompt_texts(self, job: Synthesis, reference_text: str) -> tuple[str, str]:
        """The reference and target texts as the prompt reads them (kept on the job)."""
        if job.prompt_texts is None:
            reference_text = self._text(reference_text)
            if self.generation == "cosyvoice3" and END_OF_PROMPT not in reference_text:
                reference_text = SYSTEM_PROMPT + reference_text
            job.prompt_texts = (reference_text, self._text(job.target_text))
        return job.prompt_texts

    def _prompt(self, voice: Voice, job: Synthesis) -> tuple[np.ndarray, int]:
        """The LLM prompt and the number of text tokens of the target text; RequestError when it cannot fit."""
        reference_text, target_text = self._prompt_texts(job, voice.text)
        # the two texts are read as one (as the official prompt string is tokenized); the target's own tokens
        # only set the answer's length bounds
        text_ids = self.tokenizer.encode(reference_text + target_text, add_special_tokens=False).ids
        target_tokens = len(self.tokenizer.encode(target_text, add_special_tokens=False).ids)
        speech = self.layout.speech_offset + voice.tokens.astype(np.int64)
        prompt = np.concatenate([[self.layout.sos_id], text_ids, [self.layout.task_id], speech]).astype(np.int32)
        if prompt.size > self.max_input_len:
            raise RequestError(
                f"the prompt is {prompt.size} tokens ({voice.tokens.size} of them the reference audio's, 25 a "
                f"second), more than this deployment's max_input_len {self.max_input_len}: use a shorter reference "
                "or text, or build with a larger --max-input-len"
            )
        return prompt, target_tokens

    def _generate(self, job: Synthesis, prompt: np.ndarray, max_tokens: int, min_tokens: int) -> np.ndarray:
        """The ids the LLM generates after ``prompt``: ``max_tokens`` of them, fewer when it ends (its stop token
        kept); no stop before ``min_tokens``."""
        if self.llm_reads_end_tokens or min_tokens == 0:
            return self._ask_llm(job, prompt, max_tokens, min_tokens, self.bias)
        # TensorRT-LLM holds back end_id before min_length, but not the other stop tokens (stop words): the first
        # min_tokens come from a call in which every stop token is masked, the rest from one that may stop
        speaking = min(min_tokens, max_tokens)
        first = self._ask_llm(job, prompt, speaking, 0, self.speaking_bias)
        if first.size < speaking or speaking == max_tokens:
            return first
        said = np.concatenate([prompt, first.astype(prompt.dtype)])
        return np.concatenate([first, self._ask_llm(job, said, max_tokens - speaking, 0, self.bias)])

    def _ask_llm(self, job: Synthesis, prompt: np.ndarray, max_tokens: int, min_tokens: int, bias: np.ndarray):
        """One call of the LLM with this embedding bias."""
        stops = self.layout.stop_ids
        extra = [row_tensor("pad_id", [stops[0]], np.int32), row_tensor("embedding_bias", bias, np.float32)]
        if not self.llm_reads_end_tokens:
            extra.append(row_tensor("end_id", [stops[0]], np.int32))
            if len(stops) > 1:  # every other stop token as a one-token stop word: [ids], [end offsets]
                words = np.array([[list(stops[1:]), list(range(1, len(stops)))]], dtype=np.int32)
                extra.append(pb_utils.Tensor("stop_words_list", words))
        if min_tokens > 0:
            extra.append(row_tensor(self.llm_min_tokens_input, [min_tokens], np.int32))
        ids = generate_segment(
            self.llm_model,
            prompt,
            max_tokens,
            sampling=job.sampling,
            seed=job.seed,
            seed_input=self.llm_seed_input,
            segment=job.llm_calls,
            seed_per_segment=self.seed_per_segment,
            extra=extra,
            trace=job.trace,
        )
        job.llm_calls += 1
        return ids

    def _speech_tokens(self, ids: np.ndarray) -> np.ndarray:
        """The speech tokens among the LLM's ids (up to the first stop token)."""
        tokens = []
        for token_id in ids.tolist():
            token = self.layout.speech_token(token_id)
            if token is None:
                break
            tokens.append(token)
        return np.array(tokens, dtype=np.int32)

    def _token2wav(
        self, job: Synthesis, voice: Voice, tokens: np.ndarray, extra: list, outputs: list[str], seed: int | None = None
    ):
        """``token2wav`` on the voice's prompt; CosyVoice2's vocoder noise drawn from ``seed`` when given."""
        if seed is not None and self.generation == "cosyvoice2":
            extra = [*extra, row_tensor("random_seed", [seed], np.uint64)]
        inputs = [
            row_tensor("target_speech_tokens", tokens, np.int32),
            row_tensor("prompt_speech_tokens", voice.tokens, np.int32),
            pb_utils.Tensor("prompt_speech_feat", voice.mel.astype(np.float16)[None]),
            row_tensor("prompt_spk_embedding", voice.embedding, np.float16),
            *extra,
        ]
        return call_model("token2wav", inputs, outputs, job.trace)

    def _vocode(self, job: Synthesis, mel: np.ndarray, finalize: bool) -> np.ndarray:
        inputs = [pb_utils.Tensor("mel", mel[None].astype(np.float32)), row_tensor("finalize", [finalize], np.bool_)]
        return _output(call_model("vocoder", inputs, ["tts_speech"], job.trace), "tts_speech").reshape(-1)

    def _audio_offline(self, job: Synthesis, voice: Voice, tokens: np.ndarray) -> np.ndarray:
        if self.generation == "cosyvoice2":
            return _output(self._token2wav(job, voice, tokens, [], ["waveform"], job.seed), "waveform").reshape(-1)
        mel = _output(self._token2wav(job, voice, tokens, [], ["mel"]), "mel")
        return self._vocode(job, mel.reshape(mel.shape[-2:]), finalize=True)

    def _stream(self, job: Synthesis, voice: Voice, prompt, min_tokens: int, max_tokens: int, sender) -> None:
        """Ask the LLM for the tokens of the next chunk, turn what is ready into audio, send; until the LLM ends
        or the cap is reached, then the rest of the audio and an empty final response. With ``stream_overlap``, after
        the first chunk the LLM makes the next chunk's tokens while token2wav turns the last chunk's into audio."""
        stream = _ChunkStream(self, job, voice)

        def send(audio: np.ndarray) -> None:
            if audio.size:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio.reshape(1, -1))]))

        def ask(said: np.ndarray, have: int, upto: int) -> int:
            """Start the LLM on the tokens up to ``upto`` (at most ``max_tokens``), ``have`` being said; how many it
            was asked for (0: none left, nothing started)."""
            wanted = min(max_tokens, upto) - have
            if wanted > 0:
                self.ahead.start(self._generate, job, said, wanted, min(wanted, max(0, min_tokens - have)))
            return max(wanted, 0)

        said, tokens, hop = prompt, np.zeros(0, dtype=np.int32), self.first_chunk
        wanted = ask(said, 0, hop + LOOKAHEAD_TOKENS)
        while wanted:
            ids = self.ahead.result()
            said = np.concatenate([said, ids.astype(np.int32)])
            new = self._speech_tokens(ids)
            tokens = np.concatenate([tokens, new])
            if new.size < ids.size or ids.size < wanted or sender.is_cancelled():
                break
            if tokens.size < stream.offset + hop + LOOKAHEAD_TOKENS:  # the cap came first: the last call has the rest
                break
            next_hop = min(self.max_chunk, int(hop * self.chunk_growth))
            upto = stream.offset + hop + next_hop + LOOKAHEAD_TOKENS
            if self.stream_overlap and stream.offset > 0:  # the next chunk's tokens come while this one is made
                wanted = ask(said, tokens.size, upto)
                send(stream.chunk(tokens, hop))
            else:  # the first chunk alone: beside the LLM on the GPU it would wait for it
                send(stream.chunk(tokens, hop))
                wanted = ask(said, tokens.size, upto)
            hop = next_hop
        if sender.is_cancelled():  # the client has gone: no audio for it
            sender.send(flags=FINAL)
            return
        if tokens.size == 0:
            raise RequestError(self._no_speech(max_tokens))
        send(stream.finish(tokens))
        sender.send(flags=FINAL)

    def _no_speech(self, max_tokens: int) -> str:
        return f"the LLM produced no speech tokens in {max_tokens} tokens, so there is no audio"


class _ChunkStream:
    """The audio of a stream so far: each chunk is the flow over all tokens so far (the last 3 read ahead only),
    its new frames from the offset on, then the vocoder (CosyVoice2: with the state of the chunk before;
    CosyVoice3: over all frames so far, keeping the samples not sent yet)."""

    def __init__(self, model: TritonPythonModel, job: Synthesis, voice: Voice):
        self.model, self.job, self.voice = model, job, voice
        self.calls = 0
        self.offset = 0  # tokens whose audio has gone out (or is held back by the vocoder)
        self.cache: list[pb_utils.Tensor] = []  # CosyVoice2's vocoder state, as token2wav answered it
        self.mels: list[np.ndarray] = []  # CosyVoice3's frames so far
        self.sent = 0  # CosyVoice3's samples sent

    def chunk(self, tokens: np.ndarray, hop: int) -> np.ndarray:
        audio = self._call(tokens[: self.offset + hop + LOOKAHEAD_TOKENS], finalize=False)
        self.offset += hop
        return audio

    def finish(self, tokens: np.ndarray) -> np.ndarray:
        return self._call(tokens, finalize=True)

    def _call(self, tokens: np.ndarray, finalize: bool) -> np.ndarray:
        extra = [row_tensor("token_offset", [self.offset], np.int32), row_tensor("finalize", [finalize], np.bool_)]
        if self.model.generation == "cosyvoice2":
            names = ["waveform", "cache_mel", "cache_source", "cache_speech"]
            seed = None if self.job.seed is None else segment_seed(self.job.seed, self.calls)  # fresh noise per chunk
            self.calls += 1
            response = self.model._token2wav(
                self.job, self.voice, tokens, extra + self.cache, names if not finalize else names[:1], seed
            )
            if not finalize:
                self.cache = [pb_utils.Tensor(name, _output(response, name)) for name in names[1:]]
            return _output(response, "waveform").reshape(-1)
        mel = _output(self.model._token2wav(self.job, self.voice, tokens, extra, ["mel"]), "mel")
        self.mels.append(mel.reshape(mel.shape[-2:]))
        audio = self.model._vocode(self.job, np.concatenate(self.mels, axis=1), finalize=finalize)
        new, self.sent = audio[self.sent :], audio.size
        return new
