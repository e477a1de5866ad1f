"""Decode speed of the torch engine's runtime on a random-weight Qwen2.5-0.5B-shaped model (no Triton, no download).

For each batch size it prints prefill time (TTFT of a batched prefill), the model's decode step time (CUDA graphs,
greedy, no host work), the same through the continuous-batching loop (streaming, one host sync per step), output
tokens/s, and the bandwidth bound: weight bytes read per step / HBM bandwidth measured by a device-to-device copy.
Before timing it checks the runtime against transformers (prefill logits, graph vs eager decode, greedy tokens) and
seeded sampling alone vs in a batch, graph vs eager sampling; with ``--tiny --dtype fp32`` every check must agree
exactly. The loop is timed greedy, with Spark-TTS's sampling settings (top-k 50, top-p 0.95, temperature 0.8), and
as CosyVoice asks for speech (those settings with a repetition penalty of 1.1, an embedding bias leaving only the
last ``--speech-tokens`` ids, and end tokens banned for the first half: ``speech ITL``). ``--vocab 158336`` gives
CosyVoice2's converted vocabulary; ``--profile-loop`` prints where the loop's time goes at batch 1 as CosyVoice asks.

    PYTHONPATH=. python3 bench/torch_engine_decode.py [--batches 1,4,16,64] [--tiny --device cpu]
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trtdeploy.engines.torch.runtime import (
    NEVER_STOP,
    DecoderModel,
    GenerationRequest,
    Generator,
    GeneratorConfig,
    SamplingParams,
    SlotSampler,
)

#: Spark-TTS's official sampling settings: the ranked path (top-k, then nucleus) of the sampler.
SAMPLED = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=7)
#: CosyVoice's defaults: those settings with a repetition penalty.
SPEECH = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, repetition_penalty=1.1, seed=7)

QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
}
TINY = {**QWEN25_05B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hbm_bandwidth(device: torch.device, size: int = 1 << 30, repeats: int = 20) -> float:
    """Bytes/s of a large device-to-device copy (read + write)."""
    if device.type != "cuda":
        return float("nan")
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync(device)
    return 2 * size * repeats / (time.perf_counter() - start)


class TimingSink:
    """Streaming sink that records when the first and the last token arrived."""

    def __init__(self):
        self.times: list[float] = []
        self.count = 0
        self.tokens: list[int] = []
        self.error: str | None = None
        self.done = threading.Event()

    def send_tokens(self, tokens):
        self.times.append(time.perf_counter())
        self.tokens.extend(tokens)

    def send_final(self, outputs):
        if outputs is not None:
            self.tokens = outputs[0]
        self.done.set()

    def send_error(self, message, cancelled=False):
        self.error = message
        self.done.set()

    def is_cancelled(self):
        return False


def run_requests(generator: Generator, requests: list[GenerationRequest]) -> tuple[float, list[TimingSink]]:
    sinks = [TimingSink() for _ in requests]
    start = time.perf_counter()
    for request, sink in zip(requests, sinks, strict=True):
        generator.submit(request, sink)
    for sink in sinks:
        sink.done.wait()
        if sink.error:
            raise RuntimeError(sink.error)
    return start, sinks


def inter_token(sinks: list[TimingSink]) -> float:
    """Mean milliseconds between a stream's tokens, averaged over the streams."""
    return sum((s.times[-1] - s.times[0]) / (len(s.times) - 1) for s in sinks) / len(sinks) * 1e3


def model_decode(model: DecoderModel, prompts: list[list[int]], steps: int) -> tuple[float, float]:
    """Seconds of one batched prefill, and mean seconds per greedy decode step (device-side only)."""
    device = model.device
    slots = list(range(len(prompts)))
    sync(device)
    start = time.perf_counter()
    first = model.prefill(prompts, slots).argmax(-1)
    sync(device)
    prefill = time.perf_counter() - start
    model.start(slots, first.tolist(), [len(prompt) for prompt in prompts])
    longest = max(len(prompt) for prompt in prompts)
    batch = len(prompts)
    sync(device)
    start = time.perf_counter()
    for step in range(steps):
        bucket, span = model.buckets(batch, longest + step + 1)
        chosen = model.decode(bucket, span).argmax(-1)
        model.advance(bucket, chosen)
    sync(device)
    per_step = (time.perf_counter() - start) / steps
    model.stop(slots)
    return prefill, per_step


def check(model: DecoderModel, hf: torch.nn.Module, generator_factory, length: int) -> None:
    """Print how closely the runtime follows transformers on this device (bf16 rounding differs a little)."""
    prompt = torch.randint(0, model.vocab_size, (1, length), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        reference = hf(torch.tensor(prompt, device=model.device)).logits[0, -1].float()
    ours = model.prefill(prompt, [0])[0]
    scale = reference.abs().max().item()
    print(f"check: prefill logits max |diff| {(ours - reference).abs().max().item():.4f} (max |logit| {scale:.2f})")
    model.start([0], [int(ours.argmax())], [length])
    bucket, span = model.buckets(1, length + 1)
    graphed = model.decode(bucket, span).clone()
    with torch.inference_mode():
        model._decode_forward(bucket, span)
    eager = model.logits[:bucket].clone()
    difference = (graphed - eager).abs().max().item()
    print(f"check: decode graph vs eager max |diff| {difference:.5f} (graphs: {model.use_graphs})")
    graphs = model.capture if model.use_graphs else None
    samplers = [SlotSampler(model.max_slots, model.vocab_size, model.device, capture) for capture in (None, graphs)]
    rows = min(4, model.max_slots)
    picks = []
    for sampler in samplers:
        sampler.assign(list(range(rows)), [SAMPLED] * rows, [[0]] * rows)
        picks.append([sampler.sample_decode(model.logits[:rows], model.positions[:rows]).tolist() for _ in range(2)])
    print(f"check: sampling step graph vs eager, same tokens: {picks[0] == picks[1]}")
    model.stop([0])
    generator = generator_factory()
    ids = torch.tensor(prompt, device=model.device)
    new = min(24, model.max_seq_len - length)
    expected = hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)[0, length:].tolist()
    _, greedy = run_requests(generator, [GenerationRequest(prompt, new, end_id=NEVER_STOP)])
    agree = next((i for i, (a, b) in enumerate(zip(greedy[0].tokens, expected, strict=True)) if a != b), len(expected))
    print(f"check: greedy tokens equal to HF generate: {agree}/{len(expected)}")
    sampled = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=5)
    _, alone = run_requests(generator, [GenerationRequest(prompt, new, end_id=NEVER_STOP, sampling=sampled)])
    crowd = [GenerationRequest(prompt, new, end_id=NEVER_STOP, sampling=sampled)] + [
        GenerationRequest(prompt, new, end_id=NEVER_STOP, sampling=SamplingParams(top_p=0.8, seed=i)) for i in range(5)
    ]
    _, together = run_requests(generator, crowd)
    pairs = zip(alone[0].tokens, together[0].tokens, strict=True)
    same = next((i for i, (a, b) in enumerate(pairs) if a != b), new)
    # The noise is batch-independent; in bf16 the logits are not bit-identical across batch shapes (GEMM kernels
    # differ with the row count), so a near-tie may go the other way. In fp32 the tokens must all agree.
    print(f"check: seeded sampling, same tokens alone and in a batch of 6: {same}/{new}")
    generator.close()


def speech_requests(prompts: list[list[int]], output_len: int, vocab: int, speech_tokens: int):
    """Requests as CosyVoice makes them: its sampling, a bias leaving the last ``speech_tokens`` ids (the speech
    tokens; the last of them ends the answer, banned for the first half)."""
    bias = np.zeros(vocab, dtype=np.float32)
    bias[: vocab - speech_tokens] = -np.inf
    return [
        GenerationRequest(
            [p], output_len, end_id=vocab - 1, streaming=True, sampling=SPEECH, embedding_bias=bias,
            min_tokens=output_len // 2,
        )
        for p in prompts
    ]  # fmt: skip


def profile_loop(generator: Generator, requests: list[GenerationRequest]) -> None:
    """CPU and GPU time of the continuous-batching loop serving ``requests`` (one warm-up run first)."""
    run_requests(generator, requests)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        run_requests(generator, requests)
    for key in ("cuda_time_total", "cpu_time_total"):
        print(prof.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=60))


def profile(model: DecoderModel, length: int, steps: int = 20) -> None:
    """Kernel times of eager decode steps at batch 1 (what a CUDA graph replays, minus launch gaps)."""
    model.start([0], [1], [length])
    bucket, span = model.buckets(1, length + steps + 1)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof, torch.inference_mode():
        for _ in range(steps):
            model._decode_forward(bucket, span)
            model.advance(bucket, model.logits[:bucket].argmax(-1))
        sync(model.device)
    model.stop([0])
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--no-graphs", action="store_true", help="decode eagerly (no CUDA graphs)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model, to try the script on a CPU")
    parser.add_argument("--hf-steps", type=int, default=32, help="decode steps of HF generate to time (0: skip)")
    parser.add_argument("--profile", action="store_true", help="print the top kernels of eager batch-1 decode steps")
    parser.add_argument("--vocab", type=int, default=QWEN25_05B["vocab_size"], help="vocabulary (158336: CosyVoice2)")
    parser.add_argument("--speech-tokens", type=int, default=6564, help="ids the speech requests' bias leaves")
    parser.add_argument("--profile-loop", action="store_true", help="profile the loop at batch 1, speech requests")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    max_slots, max_seq_len = max(batches), args.prompt_len + args.output_len

    torch.manual_seed(0)
    config = Qwen2Config(**{**(TINY if args.tiny else QWEN25_05B), "vocab_size": args.vocab})
    hf = Qwen2ForCausalLM._from_config(config, dtype=dtype).to(device).eval()
    model = DecoderModel(hf, max_slots=max_slots, max_seq_len=max_seq_len, cuda_graphs=not args.no_graphs)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    bandwidth = hbm_bandwidth(device)
    weights = model.weight_bytes()
    print(f"device: {name} | torch {torch.__version__} | {args.dtype} | CUDA graphs: {model.use_graphs}")
    print(
        f"weights read per step: {weights / 1e9:.3f} GB | copy bandwidth: {bandwidth / 1e12:.2f} TB/s | "
        f"bound: {weights / bandwidth * 1e3:.3f} ms/step"
    )

    limits = GeneratorConfig(max_input_len=args.prompt_len, max_num_tokens=max_slots * args.prompt_len)
    check(model, hf, lambda: Generator(model, limits), min(40, args.prompt_len))

    if args.hf_steps:
        ids = torch.randint(0, config.vocab_size, (1, args.prompt_len), device=device)
        hf.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        sync(device)
        start = time.perf_counter()
        hf.generate(ids, max_new_tokens=args.hf_steps, min_new_tokens=args.hf_steps, do_sample=False)
        sync(device)
        print(f"HF generate (eager), batch 1: {(time.perf_counter() - start) / args.hf_steps * 1e3:.2f} ms/step")

    if args.profile:
        profile(model, args.prompt_len)

    rng = torch.Generator().manual_seed(0)
    rows = []
    for batch in batches:
        prompts = torch.randint(0, config.vocab_size, (batch, args.prompt_len), generator=rng).tolist()
        model_decode(model, prompts, args.output_len)  # warm-up: captures the graphs
        prefill, step = model_decode(model, prompts, args.output_len)
        rows.append([batch, prefill * 1e3, step * 1e3, batch / step])

    generator = Generator(model, limits)
    for row, batch in zip(rows, batches, strict=True):
        prompts = torch.randint(0, config.vocab_size, (batch, args.prompt_len), generator=rng).tolist()
        requests = [GenerationRequest([p], args.output_len, end_id=NEVER_STOP, streaming=True) for p in prompts]
        run_requests(generator, requests)  # warm-up
        start, sinks = run_requests(generator, requests)
        end = max(sink.times[-1] for sink in sinks)
        ttft = sum(sink.times[0] - start for sink in sinks) / batch
        row += [ttft * 1e3, inter_token(sinks), batch * args.output_len / (end - start)]
        sampled = [
            GenerationRequest([p], args.output_len, end_id=NEVER_STOP, streaming=True, sampling=SAMPLED)
            for p in prompts
        ]
        run_requests(generator, sampled)  # warm-up: captures the sampling graphs
        row.append(inter_token(run_requests(generator, sampled)[1]))
        speech = speech_requests(prompts, args.output_len, config.vocab_size, args.speech_tokens)
        run_requests(generator, speech)
        row.append(inter_token(run_requests(generator, speech)[1]))
    if args.profile_loop:
        prompt = torch.randint(0, config.vocab_size, (1, args.prompt_len), generator=rng).tolist()
        profile_loop(generator, speech_requests(prompt, args.output_len, config.vocab_size, args.speech_tokens))
    generator.close()
    print(f"CUDA graphs captured: {len(model._graphs)} decode, {len(model._prefill_graphs)} prefill")

    print(
        f"\nprompt {args.prompt_len} tokens, output {args.output_len} tokens, greedy; model = decode steps alone, "
        "loop = Generator (streaming, host work and sends included)"
    )
    header = ["batch", "prefill ms", "model ms/step", "model tok/s", "loop TTFT ms", "loop ITL ms", "loop tok/s"]
    header += ["sampled ITL ms", "speech ITL ms"]
    print(" | ".join(f"{h:>13}" for h in header))
    for row in rows:
        print(" | ".join(f"{row[0]:>13d}" if i == 0 else f"{value:>13.2f}" for i, value in enumerate(row)))


if __name__ == "__main__":
    main()
