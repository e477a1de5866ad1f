"""`trtdeploy sweep` on the GPU: which build of Qwen2.5-0.5B holds the most tokens/s per GPU under an SLO, and how
many Spark-TTS streams one deployment holds under an RTF and first-chunk limit.

Random weights at the real sizes (no download): a Qwen2.5-0.5B-shaped checkpoint and a Spark-TTS-0.5B one (whose
LLM never stops on its own, so each request speaks exactly its target's length). Both go through the command line
as a user types it:

- ``trtdeploy sweep qwen_llm --precision bf16 --max-batch-size 16,64 -c 1,8,32,64 --slo
  'ttft_ms_p90<=200,itl_ms_p90<=10'`` (128 tokens in, exactly 256 out), printing the points table, the best point
  under the SLO and the sweep's wall time;
- ``trtdeploy sweep spark_tts --max-batch-size 64 --find max-concurrency --slo
  'rtf_p95<=1,first_chunk_ms_p95<=1000'`` (streaming), printing the concurrency found, the levels the search ran and
  those a hand-made doubling-then-bisection runs to the same answer.

    python bench/sweep_serving.py [--workdir DIR] [--tiny] [--skip qwen|spark_tts]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torch_engine_decode import QWEN25_05B, TINY

from trtdeploy.checkpoints import TinyShape, write_random_causal_lm


def sweep(work: Path, name: str, *args: str) -> dict:
    """Run ``trtdeploy sweep ARGS --json`` (progress on this terminal); its result, with the wall time."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "trtdeploy", "sweep", *args, "--output-dir", str(work / name), "--json"],
        cwd=work, stdout=subprocess.PIPE, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"trtdeploy sweep exited {done.returncode}")
    result = json.loads(done.stdout)
    result["wall_s"] = time.monotonic() - started
    print((work / name / "sweep.md").read_text())
    print(f"sweep wall time: {result['wall_s']:.0f} s")
    return result


def hand_made_levels(tried: list[tuple[int, bool]]) -> int:
    """Levels a hand-made search runs to the same answer: double from the first level until one misses the SLO,
    then bisect between the last that met it and the first that missed it (each verdict as the sweep measured
    it; a level the sweep did not run would be measured by hand too, so the count is the sweep's at best)."""
    verdict = dict(tried)
    level, runs = tried[0][0], 0
    met, missed = None, None
    while missed is None:
        runs += 1
        if verdict.get(level, False):
            met, level = level, level * 2
        else:
            missed = level
    while met is not None and missed - met > 1:
        runs += 1
        middle = (met + missed) // 2
        met, missed = (middle, missed) if verdict.get(middle, False) else (met, middle)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true", help="tiny models on the CPU, to try the script")
    parser.add_argument("--skip", default="")
    args = parser.parse_args()
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="sweep-serving-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    gpu = ["--gpu", "cpu"] if args.tiny else []
    if "qwen" not in args.skip:
        checkpoint = work / "qwen-checkpoint"
        if not checkpoint.is_dir():
            shape = TINY if args.tiny else QWEN25_05B
            fields = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
            tiny = TinyShape(**{k: shape[k] for k in fields}, num_key_value_heads=2, vocab_size=shape["vocab_size"])
            write_random_causal_lm(checkpoint, shape=tiny, max_position_embeddings=32768, dtype="bfloat16")
        precision = "fp32" if args.tiny else "bf16"
        sweep(
            work, "qwen-sweep", "qwen_llm", "--model-dir", str(checkpoint), *gpu, "--engine", "torch",
            "--precision", precision, "--max-batch-size", "16,64", "--max-input-len", "128", "--max-output-len", "256",
            "-c", "1,8,32,64", "--isl", "128", "--osl", "256", "--ignore-eos",
            "--slo", "ttft_ms_p90<=200,itl_ms_p90<=10",
        )  # fmt: skip
    if "spark_tts" not in args.skip:
        from trtdeploy_spark_tts.checkpoint import write_random_checkpoint

        checkpoint = work / "spark-checkpoint"
        if not checkpoint.is_dir():
            write_random_checkpoint(checkpoint, size="tiny" if args.tiny else "full")
        result = sweep(
            work, "spark-find", "spark_tts", "--model-dir", str(checkpoint), *gpu, "--max-batch-size", "64",
            "--mode", "streaming", "--find", "max-concurrency", "--slo", "rtf_p95<=1,first_chunk_ms_p95<=1000",
        )  # fmt: skip
        (point,) = result["points"]
        summary = json.loads((work / "spark-find" / point["run_dir"] / "summary.json").read_text())
        tried = [(level["concurrency"], bool(level["slo_met"])) for level in summary["levels"]]
        print(f"levels searched (concurrency, met): {tried}")
        print(f"max concurrency under the SLO: {summary['search']['found']}")
        by_hand = hand_made_levels(tried)
        print(f"levels run: {summary['search']['levels_run']}; a hand-made doubling then bisection: {by_hand}")


if __name__ == "__main__":
    main()
