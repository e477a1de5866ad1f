"""Speed of CosyVoice's token2wav (flow matching, then the HiFT vocoder) at the released sizes, random weights.

Writes ``flow.pt``, ``hift.pt`` and the yaml of one generation at full size (nothing is downloaded), loads them with
``trtdeploy_cosyvoice.token2wav.Token2Wav`` and times, per batch size (requests that arrive together run as one
batch):

- offline: the flow over a prompt of ``--prompt-seconds`` and a target of ``--target-seconds``, then the vocoder
  over the target's mel; the time of each stage and the RTF (time / seconds of audio made, all requests together);
- the first streamed chunk: the flow over the prompt and the first 15 tokens (+3 read ahead) with chunk-causal
  attention, then the vocoder: what token2wav adds to the first chunk's latency.

On a GPU the flow's solver replays CUDA graphs (``--eager``: without them); the script first checks that the graphed
flow gives the eager flow's mel (max abs difference printed).

    PYTHONPATH=plugins/cosyvoice python bench/cosyvoice_token2wav_speed.py [--generation cosyvoice2]
        [--precision fp16] [--batch 1,4,16] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from trtdeploy_cosyvoice.checkpoint import write_random_token2wav
from trtdeploy_cosyvoice.token2wav.model import FlowJob, Token2Wav

TOKENS_PER_SECOND = 25
FIRST_CHUNK, LOOKAHEAD = 15, 3
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def jobs(count: int, prompt_tokens: int, target_tokens: int, seed: int = 0) -> list[FlowJob]:
    rng = np.random.default_rng(seed)
    return [
        FlowJob(
            tokens=rng.integers(0, 6561, target_tokens),
            prompt_tokens=rng.integers(0, 6561, prompt_tokens),
            prompt_mel=rng.standard_normal((2 * prompt_tokens, 80)).astype(np.float32) - 5.0,
            embedding=rng.standard_normal(192).astype(np.float32),
        )
        for _ in range(count)
    ]


def timed(run, device: str, repeats: int = 3) -> float:
    run()  # warm-up (kernels, allocator)
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return best


def vocode(model: Token2Wav, mels: list[np.ndarray], finalize: bool = True) -> list[np.ndarray]:
    if model.generation == "cosyvoice2":
        return [audio for audio, _ in model.speech(mels, [None] * len(mels), finalize=finalize)]
    return model.causal_speech(mels, finalize=finalize)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generation", choices=("cosyvoice2", "cosyvoice3"), default="cosyvoice2")
    parser.add_argument("--precision", choices=tuple(DTYPES), default="fp16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", default="1,4,16")
    parser.add_argument("--prompt-seconds", type=float, default=3.0)
    parser.add_argument("--target-seconds", type=float, default=10.0)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs for the flow's solver")
    args = parser.parse_args()
    folder = args.workdir or Path(tempfile.mkdtemp(prefix="token2wav-"))
    if not (folder / "flow.pt").is_file():
        print(f"writing a random {args.generation} token2wav at the released sizes into {folder} ...", flush=True)
        write_random_token2wav(folder, args.generation, full_size=True)
    dtype = DTYPES[args.precision] if args.device != "cpu" else torch.float32
    model = Token2Wav.load(folder, args.generation, device=args.device, dtype=dtype, cuda_graphs=not args.eager)
    if args.device == "cuda" and not args.eager:
        eager = Token2Wav.load(folder, args.generation, device=args.device, dtype=dtype, cuda_graphs=False)
        for streaming, finalize, tokens in ((False, True, 250), (True, False, FIRST_CHUNK + LOOKAHEAD)):
            check = jobs(3, 75, tokens, seed=9)
            graphed = model.mels(check, streaming=streaming, finalize=finalize)
            expected = eager.mels(check, streaming=streaming, finalize=finalize)
            difference = max(float(np.abs(a - b).max()) for a, b in zip(graphed, expected, strict=True))
            print(f"graphed vs eager flow (streaming={streaming}): max abs mel difference {difference:.2e}")
        del eager
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    prompt = round(args.prompt_seconds * TOKENS_PER_SECOND)
    target = round(args.target_seconds * TOKENS_PER_SECOND)
    flow_type = str(dtype).removeprefix("torch.")
    print(f"{name}, {args.generation} token2wav, flow in {flow_type}, vocoder in float32; prompt {prompt} tokens, "
          f"target {target} tokens ({args.target_seconds:g} s)")  # fmt: skip
    print(f"flow solver: {'eager' if args.eager or args.device != 'cuda' else 'CUDA graphs'}")
    print("batch | offline: flow   vocoder   RTF    | first chunk: flow  vocoder")
    for batch in (int(value) for value in args.batch.split(",")):
        whole = jobs(batch, prompt, target)
        mels = model.mels(whole, streaming=False, finalize=True)
        flow_s = timed(lambda whole=whole: model.mels(whole, streaming=False, finalize=True), args.device)
        vocoder_s = timed(lambda mels=mels: vocode(model, mels), args.device)
        first = jobs(batch, prompt, FIRST_CHUNK + LOOKAHEAD)
        first_mels = model.mels(first, streaming=True, finalize=False)
        first_flow = timed(lambda first=first: model.mels(first, streaming=True, finalize=False), args.device)
        first_vocoder = timed(lambda mels=first_mels: vocode(model, mels, finalize=False), args.device)
        rtf = (flow_s + vocoder_s) / (batch * args.target_seconds)
        print(f"{batch:5d} | {flow_s * 1e3:8.1f} ms {vocoder_s * 1e3:7.1f} ms {rtf:7.4f} | "
              f"{first_flow * 1e3:8.1f} ms {first_vocoder * 1e3:6.1f} ms", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
