"""Whisper on the torch engine's runtime against transformers' own Whisper, on the same GPU, in one run.

The model is whisper-large-v3 at its real size with random weights (written from its config: nothing is
downloaded), so each request is forced to its row's output length: utterances are drawn like LibriSpeech test-clean
(2 to 35 s, about 7 s on average; one request is one 30 s window, so the few longer ones are cut to 30 s), with
about 3.6 transcript tokens per second of speech, as its transcripts have.
Features come from transformers' ``WhisperFeatureExtractor`` (30 s windows: 3000 frames) before the load starts.

Per concurrency level, a closed loop (each of ``c`` clients sends its next request when its last one is answered):

- ``torch engine``: trtdeploy's continuous batch (:func:`trtdeploy.engines.torch.runtime.load_generator`), the
  encoder batched over the requests admitted together on a stream of its own beside the decode steps, CUDA graphs;
  the share of GPU time in the encoder and in the decoder (prefill and decode steps) is timed with CUDA events on
  each one's stream (so the two overlap where they ran side by side).
- ``transformers``: ``WhisperForConditionalGeneration.generate`` over batches of ``c`` requests (a batch runs to its
  longest row), with the cache implementation that ran faster of dynamic and static.

Prints aggregate RTF (wall time / audio seconds), latency p50/p99 and audio seconds per second for both, and the
engine's throughput over transformers'.

    python bench/whisper_engine.py [--concurrency 1,4,16,64] [--requests 256] [--precision fp16] [--size tiny]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trtdeploy.engines.contract import NEVER_STOP, GenerationRequest, SamplingParams
from trtdeploy.engines.torch.runtime import DTYPES, load_generator
from trtdeploy.perf.asr_workload import synthetic_duration, synthetic_speech

#: openai/whisper-large-v3's shape.
LARGE_V3 = {
    "d_model": 1280,
    "encoder_layers": 32,
    "decoder_layers": 32,
    "encoder_attention_heads": 20,
    "decoder_attention_heads": 20,
    "encoder_ffn_dim": 5120,
    "decoder_ffn_dim": 5120,
    "num_mel_bins": 128,
    "vocab_size": 51866,
}
TINY = dict(LARGE_V3, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256)  # fmt: skip
#: Transcript tokens per second of speech: LibriSpeech test-clean holds about 20 words in 7.4 s, ~1.3 tokens a word.
TOKENS_PER_SECOND = 3.6
#: <|startoftranscript|><|en|><|transcribe|><|notimestamps|> in large-v3's vocabulary.
PROMPT = [50258, 50259, 50360, 50364]
SAMPLE_RATE = 16000
WINDOW_SECONDS = 30
#: The generator's counters reported per level: decode steps, those run while an admission was in flight, and the
#: prompts fed to the steps instead of prefilled.
LOOP_COUNTERS = ("steps", "steps_beside_admission", "fed_prompts")


@dataclass
class Utterance:
    seconds: float
    tokens: int
    features: np.ndarray  # [3000, n_mels]


def write_checkpoint(folder: Path, shape: dict, dtype: torch.dtype) -> None:
    """A random WhisperForConditionalGeneration of ``shape`` (transformers' own initialisation)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        **shape, max_source_positions=1500, max_target_positions=448, decoder_start_token_id=PROMPT[0],
        eos_token_id=50257, pad_token_id=50257, bos_token_id=50257, suppress_tokens=None, begin_suppress_tokens=None,
        architectures=["WhisperForConditionalGeneration"],
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # fast initialisation of large-v3 on a GPU
        model = WhisperForConditionalGeneration(config).to(dtype)
    model.save_pretrained(str(folder), safe_serialization=True)


def draw_lengths(count: int, seed: int = 0) -> list[tuple[float, int, np.ndarray]]:
    """``count`` utterances of synthetic speech drawn like LibriSpeech test-clean: (seconds, transcript tokens,
    16 kHz samples)."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(count):
        seconds = synthetic_duration(rng)
        tokens = min(max(1, round(seconds * TOKENS_PER_SECOND)), 440)
        found.append((seconds, tokens, synthetic_speech(seconds, rng)))
    return found


def utterances(count: int, n_mels: int, seed: int = 0) -> list[Utterance]:
    """:func:`draw_lengths` with each utterance's log-mel features (30 s windows: 3000 frames)."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=n_mels)
    found = []
    for drawn, tokens, audio in draw_lengths(count, seed):
        # one request is one 30 s window: an utterance drawn longer (1 in 200 or so) is cut to its first window
        seconds = min(drawn, WINDOW_SECONDS)
        tokens = min(tokens, round(WINDOW_SECONDS * TOKENS_PER_SECOND))
        window = audio[: WINDOW_SECONDS * SAMPLE_RATE]
        features = extractor(window, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features[0].T
        found.append(Utterance(seconds, tokens, np.ascontiguousarray(features, dtype=np.float32)))
    return found


def closed_loop(concurrency: int, rows: list[Utterance], run_one: Callable[[Utterance], None]) -> dict:
    """Run ``rows`` with ``concurrency`` clients, each sending its next row when the last one is answered."""
    latencies: list[float] = []
    lock = threading.Lock()
    queue = iter(rows)

    def client() -> None:
        while True:
            with lock:
                row = next(queue, None)
            if row is None:
                return
            start = time.perf_counter()
            run_one(row)
            with lock:
                latencies.append(time.perf_counter() - start)

    clients = [threading.Thread(target=client) for _ in range(concurrency)]
    start = time.perf_counter()
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    return summary(time.perf_counter() - start, latencies, rows)


def summary(wall: float, latencies: list[float], rows: list[Utterance]) -> dict:
    audio = sum(row.seconds for row in rows)
    return {
        "requests": len(rows),
        "audio_s": audio,
        "wall_s": wall,
        "rtf": wall / audio,
        "p50_ms": float(np.percentile(latencies, 50) * 1e3),
        "p99_ms": float(np.percentile(latencies, 99) * 1e3),
        "audio_s_per_s": audio / wall,
    }


class GpuTimer:
    """CUDA-event time of every call of the wrapped methods, per label (read once the level is over)."""

    def __init__(self) -> None:
        self.events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {}

    def wrap(self, owner: object, method: str, label: str) -> None:
        inner = getattr(owner, method)

        def timed(*args, **kwargs):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            result = inner(*args, **kwargs)
            end.record()
            self.events.setdefault(label, []).append((begin, end))
            return result

        setattr(owner, method, timed)

    def collect(self) -> dict[str, float]:
        if not self.events:
            return {}
        torch.cuda.synchronize()
        found = {label: sum(b.elapsed_time(e) for b, e in pairs) / 1e3 for label, pairs in self.events.items()}
        self.events.clear()
        return found


class _Done:
    """A ResponseSink that wakes its waiting client when the request is answered."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: str | None = None

    def send_tokens(self, tokens) -> None:
        pass

    def send_final(self, outputs) -> None:
        self.event.set()

    def send_error(self, message: str, cancelled: bool = False) -> None:
        self.error = message
        self.event.set()

    def is_cancelled(self) -> bool:
        return False


def engine_levels(
    checkpoint: Path, precision: str, levels: list[int], rows: list[Utterance], device: str
) -> list[dict]:
    generator = load_generator(
        checkpoint, precision=precision, device=device, max_slots=max(levels), max_input_len=16, max_seq_len=448,
    )  # fmt: skip
    timer = GpuTimer()
    if device == "cuda":
        timer.wrap(generator.model, "encode", "encoder")
        timer.wrap(generator.model, "run_prefill", "decoder")
        timer.wrap(generator.model, "decode", "decoder")
    dtype = np.float16 if precision != "fp32" else np.float32

    def run_one(row: Utterance) -> None:
        sink = _Done()
        request = GenerationRequest(
            input_ids=[PROMPT], max_new_tokens=row.tokens, end_id=NEVER_STOP, sampling=SamplingParams(top_k=1),
            encoder_features=[row.features.astype(dtype)],
        )  # fmt: skip
        generator.submit(request, sink)
        sink.event.wait()
        if sink.error:
            raise RuntimeError(sink.error)

    for concurrency in levels:  # warm-up: each level once, capturing the CUDA graphs of the buckets it meets
        closed_loop(concurrency, rows[: level_size(concurrency, rows)], run_one)
    timer.collect()
    results = []
    for concurrency in levels:
        before = {name: getattr(generator, name) for name in LOOP_COUNTERS}
        captures = generator.model.captures
        result = closed_loop(concurrency, rows[: level_size(concurrency, rows)], run_one)
        shares = timer.collect()
        result.update({f"{label}_s": seconds for label, seconds in shares.items()})
        result.update({name: getattr(generator, name) - before[name] for name in LOOP_COUNTERS})
        result["captures"] = generator.model.captures - captures  # CUDA graphs first met during the level
        result["step_ms"] = result["wall_s"] / max(result["steps"], 1) * 1e3
        results.append(result)
        print(f"  torch engine c={concurrency}: {json.dumps(_rounded(result))}", flush=True)
    generator.close()
    return results


def transformers_levels(
    checkpoint: Path, precision: str, levels: list[int], rows: list[Utterance], device: str
) -> list[dict]:
    from transformers import WhisperForConditionalGeneration
    from transformers.utils import logging

    logging.set_verbosity_error()  # generate's notes on min/max lengths, once per batch
    dtype = DTYPES[precision]
    model = WhisperForConditionalGeneration.from_pretrained(str(checkpoint), dtype=dtype).to(device).eval()
    results = []
    for concurrency in levels:
        best = None
        for cache in ("dynamic", "static"):
            try:
                result = _transformers_level(
                    model, dtype, concurrency, rows[: level_size(concurrency, rows)], cache, device
                )
            except Exception as exc:  # a cache implementation this transformers cannot run for Whisper
                print(f"  transformers c={concurrency} cache={cache}: failed ({exc})", flush=True)
                continue
            result["cache"] = cache
            print(f"  transformers c={concurrency}: {json.dumps(_rounded(result))}", flush=True)
            if best is None or result["wall_s"] < best["wall_s"]:
                best = result
        results.append(best)
    return results


def _transformers_level(model, dtype, concurrency: int, rows: list[Utterance], cache: str, device: str) -> dict:
    """Static batches of ``concurrency`` rows in order; every row of a batch waits for the whole batch."""

    def run_batch(batch: list[Utterance]) -> None:
        features = torch.from_numpy(np.stack([row.features.T for row in batch])).to(device, dtype)
        prompt = torch.tensor([PROMPT] * len(batch), device=device)
        longest = max(row.tokens for row in batch)
        with torch.inference_mode():
            model.generate(
                input_features=features, decoder_input_ids=prompt, max_new_tokens=longest, min_new_tokens=longest,
                do_sample=False, num_beams=1, cache_implementation=cache if cache == "static" else None,
            )  # fmt: skip
        if device == "cuda":
            torch.cuda.synchronize()

    # Warm-up: the static cache compiles its forward pass on first use, again when a shape first changes (then with
    # dynamic shapes) and at times later still (a run measured a 2.3 s batch inside the level after a three-batch
    # warm-up), so it first runs the whole level once; with its eager dynamic cache three batches do.
    warm_up = len(rows) if cache == "static" else 3 * concurrency
    for first in range(0, warm_up, concurrency):
        run_batch(rows[first : first + concurrency])
    latencies = []
    start = time.perf_counter()
    for first in range(0, len(rows), concurrency):
        batch = rows[first : first + concurrency]
        begin = time.perf_counter()
        run_batch(batch)
        latencies.extend([time.perf_counter() - begin] * len(batch))
    return summary(time.perf_counter() - start, latencies, rows)


def level_size(concurrency: int, rows: list[Utterance]) -> int:
    """Requests of a level: 16 per client, at least 64 and at most all the rows."""
    return min(max(16 * concurrency, 64), len(rows))


def _rounded(result: dict) -> dict:
    return {key: round(value, 4) if isinstance(value, float) else value for key, value in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--requests", type=int, default=512, help="most requests of a level (16 per client)")
    parser.add_argument("--precision", choices=("fp16", "bf16", "fp32"), default="fp16")
    parser.add_argument("--size", choices=("large-v3", "tiny"), default="large-v3")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    machine = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    shape = LARGE_V3 if args.size == "large-v3" else TINY
    work = args.workdir or Path(tempfile.mkdtemp(prefix="whisper-bench-"))
    checkpoint = work / f"whisper-{args.size}-{args.precision}"
    if not (checkpoint / "config.json").is_file():
        write_checkpoint(checkpoint, shape, DTYPES[args.precision])
    count = args.requests
    rows = utterances(count, shape["num_mel_bins"])
    audio = sum(row.seconds for row in rows)
    print(f"{machine}, whisper {args.size} (random weights), {args.precision}; up to {count} utterances a level, "
          f"{audio:.0f} s of audio ({audio / count:.1f} s mean), {sum(r.tokens for r in rows) / count:.1f} tokens "
          "mean", flush=True)  # fmt: skip
    engine = engine_levels(checkpoint, args.precision, levels, rows, device)
    if device == "cuda":
        torch.cuda.empty_cache()
    baseline = [None] * len(levels) if args.skip_transformers else transformers_levels(
        checkpoint, args.precision, levels, rows, device
    )  # fmt: skip
    print(f"\n{machine}, whisper {args.size}, {args.precision}")
    print(f"{'conc':>4} | {'engine RTF':>10} {'p50':>8} {'p99':>8} {'enc/dec GPU share':>18} | "
          f"{'transformers RTF':>16} {'p50':>8} {'p99':>8} {'cache':>7} | {'speed-up':>8}")  # fmt: skip
    for concurrency, ours, theirs in zip(levels, engine, baseline, strict=True):
        busy = ours.get("encoder_s", 0.0) + ours.get("decoder_s", 0.0)
        share = f"{ours.get('encoder_s', 0) / busy:.0%} / {ours.get('decoder_s', 0) / busy:.0%}" if busy else "-"
        line = (
            f"{concurrency:>4} | {ours['rtf']:>10.4f} {ours['p50_ms']:>6.0f}ms {ours['p99_ms']:>6.0f}ms {share:>18} | "
        )
        if theirs:
            line += (f"{theirs['rtf']:>16.4f} {theirs['p50_ms']:>6.0f}ms {theirs['p99_ms']:>6.0f}ms "
                     f"{theirs['cache']:>7} | {theirs['rtf'] / ours['rtf']:>7.2f}x")  # fmt: skip
        print(line)


if __name__ == "__main__":
    main()
