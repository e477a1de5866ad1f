"""A long prompt entering a batch of decoding streams on the torch engine's runtime (no Triton, no download).

A random-weight Qwen2.5-0.5B-shaped model (bf16): the prefill of one ``--prompt-len``-token prompt at batch 1
(tokens/s), then ``--streams`` streams decoding when that prompt arrives, with the prefill run in turn with the
decode steps (the default for decoder LMs) and on a stream of its own beside them (``overlap_admission``, what
Whisper does). Prints the streams' inter-token gaps (p50, and the longest, which the entry causes) and the entry's
TTFT for each, and whether the long request's greedy tokens are the same both ways.

    PYTHONPATH=. python3 bench/torch_engine_long_prompt.py [--prompt-len 2048] [--streams 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch_engine_decode import QWEN25_05B, TimingSink
from transformers import Qwen2Config, Qwen2ForCausalLM

from trtdeploy.engines.torch.runtime import NEVER_STOP, DecoderModel, GenerationRequest, Generator, GeneratorConfig


def prefill_seconds(model: DecoderModel, prompt: list[int], repeats: int = 5) -> float:
    for _ in range(3):
        model.prefill([prompt], [0])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        model.prefill([prompt], [0])
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def entry(generator: Generator, short: list[list[int]], long: list[int]) -> dict:
    """Streams decoding, then the long prompt: the streams' gaps (ms), the entry's TTFT (ms) and tokens."""
    sinks = [TimingSink() for _ in short]
    for prompt, sink in zip(short, sinks, strict=True):
        generator.submit(GenerationRequest([prompt], 400, end_id=NEVER_STOP, streaming=True), sink)
    time.sleep(0.15)  # the streams are decoding
    arrival, new = time.perf_counter(), TimingSink()
    generator.submit(GenerationRequest([long], 16, end_id=NEVER_STOP, streaming=True), new)
    for sink in [*sinks, new]:
        sink.done.wait()
    gaps = np.concatenate([np.diff(sink.times) for sink in sinks]) * 1e3
    return {"p50": float(np.median(gaps)), "max": float(gaps.max()), "ttft": (new.times[0] - arrival) * 1e3,
            "tokens": new.tokens}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--streams", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = Qwen2Config(**QWEN25_05B)
    hf = Qwen2ForCausalLM._from_config(config, dtype=torch.bfloat16).to("cuda").eval()
    rng = torch.Generator().manual_seed(0)
    short = torch.randint(0, config.vocab_size, (args.streams, 128), generator=rng).tolist()
    long = torch.randint(0, config.vocab_size, (1, args.prompt_len), generator=rng).tolist()[0]
    print(f"{torch.cuda.get_device_name()}, bf16; {args.streams} streams of 128 + 400 tokens, then a "
          f"{args.prompt_len}-token prompt")  # fmt: skip
    found = {}
    for overlap in (False, True):
        DecoderModel.overlap_admission = overlap
        model = DecoderModel(hf, max_slots=args.streams + 8, max_seq_len=args.prompt_len + 512, cuda_graphs=True)
        seconds = prefill_seconds(model, long)
        generator = Generator(model, GeneratorConfig(max_input_len=args.prompt_len, max_num_tokens=8192))
        entry(generator, short, long)  # warm-up: the graphs of every bucket met
        found[overlap] = {"prefill": seconds, **entry(generator, short, long)}
        generator.close()
        del model, generator
        torch.cuda.empty_cache()
    for overlap, row in found.items():
        where = "beside" if overlap else "between"
        print(f"admission {where} the steps: prefill at batch 1 {row['prefill'] * 1e3:.2f} ms "
              f"({args.prompt_len / row['prefill']:,.0f} tokens/s) | streams' gaps p50 {row['p50']:.2f} ms, longest "
              f"{row['max']:.2f} ms ({row['max'] / row['p50']:.1f}x) | entry TTFT {row['ttft']:.1f} ms")  # fmt: skip
    print("the long request's tokens the same both ways:", found[False]["tokens"] == found[True]["tokens"])


if __name__ == "__main__":
    main()
