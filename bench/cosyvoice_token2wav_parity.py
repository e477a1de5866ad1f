"""Parity of ``trtdeploy_cosyvoice.token2wav`` (``Token2Wav``: flow + HiFT) with the official CosyVoice code, on random
full-size weights (nothing downloaded).

For each generation it writes random weights at the released sizes in the official layout (``cosyvoice{2,3}.yaml``,
``flow.pt``, ``hift.pt``, with ``write_random_token2wav``), builds the official modules from that yaml with
HyperPyYAML and loads the weights into them, loads the same folder with ``Token2Wav.load``, and prints the max abs
difference of:

- the mel and the audio of an offline request (the official ``token2wav`` with ``stream=False, finalize=True``);
- every call of a streamed request, driven as the official Triton BLS drives it (the first call at 15 tokens plus 3
  read ahead, then hops of 25 and 50, then the rest with ``finalize``): the call's new mel frames and its audio
  (CosyVoice2: the official mel/source cache and cross-fade against ours; CosyVoice3: the causal vocoder over the
  whole mel so far, the new samples only);
- a batch of two requests of different lengths (ours) against each request alone (official), offline.

CosyVoice2's vocoder adds fresh Gaussian noise on every call: the official call runs right after
``torch.manual_seed(s)`` and ours gets the request seed ``s``, which draws the same noise. The script exits non-zero
when a difference exceeds ``--tolerance``. One request alone is expected to agree to float32 rounding of the mel
(CosyVoice3: exactly); a batch rounds its float32 sums differently, about 1e-6 in the mel, which the vocoder turns into
about 1e-4 in the audio (it integrates F0 over time into the excitation's phase), far below what a wrong step gives
(the vocoder's noise alone is 3e-3 to 3e-2).

It needs the official code importable (on ``PYTHONPATH``): the FunAudioLLM/CosyVoice repository (checked at commit
ace7c47, March 2026) and its Matcha-TTS submodule (``third_party/Matcha-TTS``, commit dd9105b), with the packages
their flow and vocoder import: diffusers 0.29.0 (which needs transformers 4.44 and huggingface_hub older than 0.26
beside it), x-transformers 2.11.24, conformer 0.3.2, einops, omegaconf, scipy and HyperPyYAML 1.2.3, over this
project's torch. Imports that nothing here uses need stand-ins: ``cosyvoice.utils`` imports ``torchaudio`` (its
``compliance.kaldi``) and ``onnxruntime``, for which empty modules do where they are not installed; Matcha's
``matcha/utils/__init__.py`` is emptied (it imports hydra and lightning) and ``matcha/utils/pylogger.py`` reduced to
a ``get_pylogger`` returning a standard ``logging`` logger::

    PYTHONPATH=<CosyVoice>:<Matcha-TTS>:<stand-ins>:<packages> python bench/cosyvoice_token2wav_parity.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import torch
from trtdeploy_cosyvoice.checkpoint import write_random_token2wav
from trtdeploy_cosyvoice.generations import GenerationName
from trtdeploy_cosyvoice.token2wav.model import FlowJob, Token2Wav

#: The official Triton BLS's hops (tokens a streaming call adds) before the final call, and its lookahead.
HOPS = (15, 25, 50)
LOOKAHEAD = 3


class Report:
    def __init__(self, tolerance: float):
        self.tolerance = tolerance
        self.worst = 0.0

    def compare(self, label: str, ours: np.ndarray, official: np.ndarray) -> None:
        if ours.shape != official.shape:
            print(f"  {label:58s} shapes DIFFER: ours {ours.shape}, official {official.shape}")
            self.worst = float("inf")
            return
        difference = float(np.abs(ours - official).max()) if ours.size else 0.0
        self.worst = max(self.worst, difference)
        print(f"  {label:58s} {difference:.3g}  (|official| max {float(np.abs(official).max()):.3g}, {ours.shape})")

    @property
    def passed(self) -> bool:
        return self.worst <= self.tolerance


def official_model(folder: Path, generation: GenerationName, device: torch.device):
    """The official CosyVoice2Model / CosyVoice3Model around the yaml's flow and hift (no LLM), weights loaded as the
    official loader loads them."""
    from cosyvoice.cli.model import CosyVoice2Model, CosyVoice3Model
    from hyperpyyaml import load_hyperpyyaml

    with open(folder / f"{generation}.yaml") as file:
        # the LLM and the front end's mel function are not needed (and would import more)
        modules = load_hyperpyyaml(file, overrides={"llm": None, "feat_extractor": None})
    flow, hift = modules["flow"], modules["hift"]
    flow.load_state_dict(torch.load(folder / "flow.pt", map_location="cpu", weights_only=True), strict=True)
    hift_state = torch.load(folder / "hift.pt", map_location="cpu", weights_only=True)
    hift.load_state_dict({key.replace("generator.", ""): value for key, value in hift_state.items()}, strict=True)
    model_class = CosyVoice2Model if generation == "cosyvoice2" else CosyVoice3Model
    model = model_class(None, flow.to(device).eval(), hift.to(device).eval())
    model.device = device
    return model


class Request:
    """Random speech tokens and a random prompt (its tokens, mel and speaker embedding)."""

    def __init__(self, seed: int, prompt_tokens: int, tokens: int):
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, 6561, (1, tokens), generator=generator, dtype=torch.int32)
        self.prompt_tokens = torch.randint(0, 6561, (1, prompt_tokens), generator=generator, dtype=torch.int32)
        self.prompt_mel = torch.randn(1, 2 * prompt_tokens, 80, generator=generator) * 2 - 5
        self.embedding = torch.randn(1, 192, generator=generator)

    def job(self, end: int, offset: int) -> FlowJob:
        return FlowJob(
            tokens=self.tokens[0, :end].numpy(),
            prompt_tokens=self.prompt_tokens[0].numpy(),
            prompt_mel=self.prompt_mel[0].numpy(),
            embedding=self.embedding[0].numpy(),
            token_offset=offset,
        )

    def official_mel(self, model, end: int, offset: int, streaming: bool, finalize: bool) -> np.ndarray:
        def lengths(tensor: torch.Tensor) -> torch.Tensor:
            return torch.tensor([tensor.shape[1]], dtype=torch.int32, device=model.device)

        tokens = self.tokens[:, :end].to(model.device)
        prompt_tokens, prompt_mel = self.prompt_tokens.to(model.device), self.prompt_mel.to(model.device)
        mel, _ = model.flow.inference(
            token=tokens,
            token_len=lengths(tokens),
            prompt_token=prompt_tokens,
            prompt_token_len=lengths(prompt_tokens),
            prompt_feat=prompt_mel,
            prompt_feat_len=lengths(prompt_mel),
            embedding=self.embedding.to(model.device),
            streaming=streaming,
            finalize=finalize,
        )
        return mel[0, :, 2 * offset :].float().cpu().numpy()

    def official_speech(self, model, call_id: str, end: int, offset: int, stream: bool, finalize: bool, seed: int):
        torch.manual_seed(seed)
        speech = model.token2wav(
            self.tokens[:, :end],
            self.prompt_tokens,
            self.prompt_mel,
            self.embedding,
            token_offset=offset,
            uuid=call_id,
            stream=stream,
            finalize=finalize,
        )
        return speech[0].float().cpu().numpy()


def stream_calls(tokens: int) -> list[tuple[int, int, bool]]:
    """``(tokens sent, token_offset, finalize)`` of each call of a stream, as the official Triton BLS makes them."""
    calls, offset = [], 0
    for hop in HOPS:
        if offset + hop + LOOKAHEAD > tokens:
            break
        calls.append((offset + hop + LOOKAHEAD, offset, False))
        offset += hop
    return [*calls, (tokens, offset, True)]


def compare_generation(generation: GenerationName, args: argparse.Namespace, report: Report) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder)
        started = time.perf_counter()
        write_random_token2wav(checkpoint, generation, full_size=True, seed=args.seed)
        print(f"{generation}: full-size random flow.pt/hift.pt written in {time.perf_counter() - started:.1f} s")
        official = official_model(checkpoint, generation, device)
        ours = Token2Wav.load(checkpoint, generation, device=device)
    v2 = generation == "cosyvoice2"
    request = Request(args.seed + 1, args.prompt_tokens, args.tokens)
    other = Request(args.seed + 2, args.prompt_tokens // 2 + 3, args.tokens // 2 + 7)

    def our_audio(mels: list[np.ndarray], caches: list, finalize: bool, seeds: list[int]) -> list:
        if v2:
            return ours.speech(mels, caches, finalize=finalize, seeds=seeds)
        return [(speech, None) for speech in ours.causal_speech(mels, finalize=finalize)]

    print(" offline:")
    started = time.perf_counter()
    mel = ours.mels([request.job(args.tokens, 0)], streaming=False, finalize=True)[0]
    report.compare("mel", mel, request.official_mel(official, args.tokens, 0, streaming=False, finalize=True))
    official.hift_cache_dict[call_id := str(uuid.uuid4())] = None
    expected = request.official_speech(official, call_id, args.tokens, 0, stream=False, finalize=True, seed=11)
    [(speech, _)] = our_audio([mel], [None], True, [11])
    report.compare("audio", speech, expected)

    print(" streamed (each call's new mel and audio):")
    official.hift_cache_dict[call_id := str(uuid.uuid4())] = None
    cache, whole_mel, sent, pieces = None, np.zeros((80, 0), np.float32), 0, []
    for call, (end, offset, finalize) in enumerate(stream_calls(args.tokens)):
        streaming = not finalize  # the official final call runs with full attention
        mel = ours.mels([request.job(end, offset)], streaming=streaming, finalize=finalize)[0]
        label = f"call {call}: {end} tokens from {offset}{', finalize' if finalize else ''}"
        report.compare(f"{label}: mel", mel, request.official_mel(official, end, offset, streaming, finalize))
        seed = 100 + call
        expected = request.official_speech(official, call_id, end, offset, streaming, finalize, seed)
        if v2:
            [(speech, cache)] = our_audio([mel], [cache], finalize, [seed])
        else:
            whole_mel = np.concatenate([whole_mel, mel], axis=1)
            [(speech, _)] = our_audio([whole_mel], [None], finalize, [seed])
            speech, sent = speech[sent:], len(speech)
        report.compare(f"{label}: audio", speech, expected)
        pieces.append(speech)
    streamed = np.concatenate(pieces)
    print(f"  streamed audio: {len(streamed)} samples, offline {2 * args.tokens * 480}")

    print(" a batch of two requests (ours) against each alone (official), offline:")
    jobs = [request.job(args.tokens, 0), other.job(other.tokens.shape[1], 0)]
    mels = ours.mels(jobs, streaming=False, finalize=True)
    audio = our_audio(mels, [None, None], True, [21, 22])
    for row, (item, seed) in enumerate(zip((request, other), (21, 22), strict=True)):
        end = item.tokens.shape[1]
        report.compare(
            f"row {row}: mel", mels[row], item.official_mel(official, end, 0, streaming=False, finalize=True)
        )
        official.hift_cache_dict[call_id := str(uuid.uuid4())] = None
        expected = item.official_speech(official, call_id, end, 0, stream=False, finalize=True, seed=seed)
        report.compare(f"row {row}: audio", audio[row][0], expected)
    print(f" {generation} done in {time.perf_counter() - started:.0f} s on {device}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generation", choices=("cosyvoice2", "cosyvoice3", "both"), default="both")
    parser.add_argument("--tokens", type=int, default=100, help="speech tokens of the request (25 a second)")
    parser.add_argument("--prompt-tokens", type=int, default=30, help="speech tokens of its prompt")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest mel or audio difference that passes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    report = Report(args.tolerance)
    generations = ("cosyvoice2", "cosyvoice3") if args.generation == "both" else (args.generation,)
    for generation in generations:
        compare_generation(generation, args, report)
    print(
        f"largest difference {report.worst:.3g} (tolerance {args.tolerance:g}): {'PASS' if report.passed else 'FAIL'}"
    )
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
