"""Inputs the speech integration tests share."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from trtdeploy.perf.report import write_wav
from trtdeploy.perf.tts import synthetic_voice


def inputs_file(folder: Path) -> Path:
    """A jsonl of three rows: references at 22.05 kHz (resampled by perf), one Chinese target."""
    rows = []
    for index, (seconds, target) in enumerate([(1.0, "Good morning."), (1.5, "今天天气很好。"), (0.8, "Bye now!")]):
        write_wav(folder / f"ref{index}.wav", synthetic_voice(seconds, np.random.default_rng(index), 22050), 22050)
        rows.append(
            {"id": f"utt{index}", "reference_audio": f"ref{index}.wav", "reference_text": "hi", "target_text": target}
        )
    path = folder / "tts.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path
