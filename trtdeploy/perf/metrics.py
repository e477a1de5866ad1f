"""Per-request metrics and the summary of a level; :data:`DEFINITIONS` says what each one means.

Times come from ``perf_counter_ns``; a level's measured requests exclude its warmup.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from .slo import Slo, SloTally

if TYPE_CHECKING:
    from .loadgen import Level
    from .records import Record

#: What every reported number means (also written into summary.json).
DEFINITIONS = {
    "e2e_ms": "last response of the request (the final flag of a stream) minus its send time",
    "ttft_ms": "streamed requests: first response with content minus send time; a request that generated no "
    "token has none (left out of the statistics)",
    "itl_ms": "(E2E - TTFT) / (output tokens - tokens in the first chunk), when that denominator is > 0 (not for "
    "answers of zero tokens, nor when every token came in the first chunk)",
    "icl_ms": "gaps between consecutive chunks with content, pooled over the requests",
    "output_tokens_per_user": "1000 / ITL of one request: the tokens/s one user sees while the answer streams "
    "(AIPerf's and genai-perf's definition; TTFT is not in it)",
    "duration_s": "window: last end minus first send over the measured requests",
    "request_throughput": "successful requests / window",
    "input_token_throughput": "input tokens of the successful requests / window",
    "output_token_throughput": "output tokens of the successful requests / window",
    "zero_output_requests": "successful requests that generated no token (end-of-sequence first): counted with "
    "0 output tokens, with no TTFT or ITL",
    "achieved_concurrency": "sum of the measured requests' E2E / window",
    "goodput": "successful requests meeting every per-request --slo limit (a key without a percentile suffix; "
    "each 'at most') / window. A request without a value for a limited metric fails that limit (a zero-token "
    "answer has no TTFT and meets no ttft_ms or itl_ms limit; a TTS request without audio meets no first_chunk_ms "
    "or rtf limit), except itl_ms for a request whose tokens all came in its first chunk (it has a TTFT, and no "
    "gap between tokens)",
    "attainment": "--slo: share of the measured requests (failed ones included) meeting every per-request limit",
    "slo_percentiles": "--slo limits with a percentile suffix (rtf_p95): the value that that percentage of the "
    "measured requests do not exceed (nearest rank; a failed request, or one without a value, counts as above "
    "any limit: null when such requests reach that rank)",
    "slo_met": "--slo: every percentile limit held and, when the SLO has per-request limits, the level's "
    "attainment reached --attainment",
    "search": "--find: found, the highest concurrency or request rate whose level met the SLO (null: none did), "
    "and level, its index among the levels (run in the search's order); lowest_failed, the lowest value above it "
    "whose level did not; ceiling_reached: every level met it up to start x 1024, where the search stopped; "
    "levels_run",
    "build": "the deployment the run loaded: its folder's point name, model plugin, engine, precision, GPU profile "
    "it was built for, max batch size, TP, PP, replicas, mode, engine version and the GPUs it takes (gpus_needed: "
    "TP x PP x replicas); null for a server without a deployment folder here (remote, or OpenAI-compatible)",
    "remote": "a Triton that trtdeploy did not start here (null: a deployment's): workload, the installed model "
    "whose workload loaded it (tensorrt_llm: the LLM contract); chosen_by, config (recognized from the model's "
    "configuration) or --workload; tokenizer, --tokenizer as given. Its limits are not known: lengths are as given",
    "token_source": "server: counted from returned token ids, or the usage an OpenAI-compatible server reported; "
    "retokenized: the output text re-encoded with the model's tokenizer",
    "endpoint": "triton (a Triton deployment) or openai (an OpenAI-compatible server: its api, completions or chat, "
    "the tokenizer perf counted with, and served_by, the owner its model list names)",
    "accuracy.exact_match": "share of the successful requests with a reference output whose output equals it "
    "after collapsing whitespace",
    "accuracy.rouge_l_f1": "mean ROUGE-L F1 (longest common subsequence, beta 1) over whitespace tokens of "
    "output and reference, over the same requests",
    "first_chunk_ms": "TTS: first chunk with audio minus send time",
    "second_chunk_ms": "TTS: second chunk minus first chunk",
    "first_partial_ms": "ASR, streamed: first response with a non-empty transcript minus send time",
    "rtf": "E2E / audio seconds of one request (TTS: the audio produced; ASR: the audio sent; lower is better)",
    "rtf_aggregate": "TTS and ASR: window / total audio seconds of the successful requests",
    "audio_seconds_per_second": "ASR: total audio seconds of the successful requests / window",
    "characters_per_second": "TTS: characters of the texts the successful requests spoke / window",
    "input_rows_reused": "measured requests sent with an input row that an earlier request of the run (warmup "
    "included) was sent with: 0 unless the input has fewer rows than the run sends, --reuse-rows asks for it, or "
    "a closed-loop level run for a --duration cycled through its rows",
    "planned_requests": "measured requests the level was to send (fewer were sent when it ended early, or with "
    "--duration when the deadline came first); null for a closed-loop level run for a --duration",
    "duration_limit_s": "--duration: the seconds the level's measured requests were sent for (no request went out "
    "after them; the requests in flight then were waited for, so the window runs past them); null: a request count",
    "status": "complete, or how the level ended early: server_lost (the server stopped answering; the requests "
    "in flight failed) or interrupted (Ctrl-C; the requests in flight failed)",
    "server.metrics.gauges": "each Prometheus gauge sampled about every second while the level ran: min, mean, max",
    "underrun_requests": "TTS: requests with a chunk that arrived after the audio received before it had "
    "finished playing (playback starting at the first chunk)",
    "scheduling_lag_ms": "request rate: send time minus the arrival time it was due at (with --max-concurrency, "
    "the wait for a free slot too)",
    "client_cpu_utilization": "CPU seconds of the busiest client process / window; near 1 the client, not "
    "the server, may be the bottleneck",
    "asr": "TTS: intelligibility of the first measured request of each input row, transcribed by Whisper: "
    "punctuation (ASCII and Chinese, but the apostrophe) stripped, English lower-cased and scored per word, Chinese "
    "per character (seed-tts-eval's rules); wer_mean/cer_mean: mean of the per-utterance rates (seed-tts-eval's "
    "number, as a fraction); wer_corpus/cer_corpus: all errors / all reference words or characters. ASR: every "
    "successful measured request with a reference transcript, normalised as Whisper's evaluation does (English: "
    "its English normaliser and spelling map, scored per word; Chinese: its basic normaliser, scored per character "
    "without spaces; other languages: the basic normaliser, per word), aligned by jiwer; wer_* over the utterances "
    "scored per word, cer_* over those scored per character; *_mean: mean of the per-utterance rates; *_corpus: "
    "all errors / all reference words or characters; unscored: requests without a reference (synthetic speech has "
    "none); each request's alignment is in requests.jsonl under 'asr'",
    "statistics": "count, mean, population std, min, p50/p90/p95/p99 (linear interpolation), max",
}
PERCENTILES = (50, 90, 95, 99)
#: Distinct error messages kept in a level summary.
ERROR_SAMPLES = 5


def describe(values: Iterable[float]) -> dict[str, float] | None:
    """count, mean, std, min, percentiles, max of ``values``; None when there are none."""
    import numpy as np

    data = np.fromiter(values, dtype=float)
    if data.size == 0:
        return None
    stats = {"count": int(data.size), "mean": float(data.mean()), "std": float(data.std()), "min": float(data.min())}
    for q, value in zip(PERCENTILES, np.percentile(data, PERCENTILES), strict=True):
        stats[f"p{q}"] = float(value)
    stats["max"] = float(data.max())
    return stats


def normalize_text(text: str) -> str:
    return " ".join(text.split())


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence, bit-parallel over ``b`` (Allison-Dix / Hyyrö).

    ``v`` has one bit per position of ``b``; after each token of ``a`` its zero bits count the LCS so far.
    O(len(a) * len(b) / word) with Python's big integers instead of an O(len(a) * len(b)) table.
    """
    if not a or not b:
        return 0
    masks: dict[str, int] = {}
    for position, token in enumerate(b):
        masks[token] = masks.get(token, 0) | (1 << position)
    full = (1 << len(b)) - 1
    v = full
    for token in a:
        u = v & masks.get(token, 0)
        v = ((v + u) | (v - u)) & full
    return len(b) - v.bit_count()


def rouge_l_f1(candidate: str, reference: str) -> float:
    """ROUGE-L F1 (beta = 1) over whitespace tokens; 1.0 when both are empty."""
    cand, ref = candidate.split(), reference.split()
    if not cand and not ref:
        return 1.0
    lcs = lcs_length(cand, ref)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(cand), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def underruns(chunk_ns: Sequence[int], chunk_audio: Sequence[float]) -> int:
    """Chunks that arrived after the audio received before them had finished playing."""
    if not chunk_ns:
        return 0
    start, played, count = chunk_ns[0], 0.0, 0
    for arrived, seconds in zip(chunk_ns, chunk_audio, strict=True):
        if (arrived - start) / 1e9 > played + 1e-9:
            count += 1
        played += seconds
    return count


def request_metrics(rec: Record, *, stream: bool, family: str) -> dict[str, Any]:
    """The per-request metrics of one decoded, successful record (None where not defined)."""
    e2e_ms = (rec.end_ns - rec.send_ns) / 1e6
    first_ms = (rec.chunk_ns[0] - rec.send_ns) / 1e6 if stream and rec.chunk_ns else None
    gaps = [(b - a) / 1e6 for a, b in pairwise(rec.chunk_ns)] if stream else []
    out: dict[str, Any] = {"e2e_ms": e2e_ms}
    if family == "tts":
        audio = rec.audio_seconds if rec.audio_seconds is not None else (sum(rec.chunk_audio) or None)
        out["first_chunk_ms"] = first_ms
        out["second_chunk_ms"] = gaps[0] if gaps else None
        out["rtf"] = e2e_ms / 1e3 / audio if audio else None
        out["audio_seconds"] = audio
        out["underruns"] = underruns(rec.chunk_ns, rec.chunk_audio) if stream else None
        out["input_characters"] = rec.input_characters
    elif family == "asr":
        audio = rec.audio_seconds
        out["first_partial_ms"] = first_ms
        out["rtf"] = e2e_ms / 1e3 / audio if audio else None
        out["audio_seconds"] = audio
    else:
        tokens, first_tokens = rec.output_tokens, rec.first_chunk_tokens
        out["ttft_ms"] = first_ms
        defined = first_ms is not None and tokens is not None and first_tokens is not None and tokens > first_tokens
        out["itl_ms"] = (e2e_ms - first_ms) / (tokens - first_tokens) if defined else None
        itl = out["itl_ms"]
        out["output_tokens_per_user"] = 1e3 / itl if itl else None
    out["icl_ms"] = gaps
    if family == "llm" and rec.reference is not None and rec.text is not None:
        out["exact_match"] = normalize_text(rec.text) == normalize_text(str(rec.reference))
        out["rouge_l_f1"] = rouge_l_f1(rec.text, str(rec.reference))
    return out


def _per_second(amount: float | None, window_s: float) -> float | None:
    return amount / window_s if amount is not None and window_s > 0 else None


#: Per-request metrics kept as series for the level's statistics, per family.
_SERIES = {
    "llm": ("ttft_ms", "itl_ms", "e2e_ms", "output_tokens_per_user", "input_tokens", "output_tokens"),
    "tts": ("first_chunk_ms", "second_chunk_ms", "e2e_ms", "rtf"),
    "asr": ("first_partial_ms", "e2e_ms", "rtf"),
}
#: ASR transcript scores per metric: the prefix of their counts in a level's ``asr`` summary.
_UNITS = {"wer": ("word", "words"), "cer": ("char", "chars")}


class TranscriptTotals:
    """The ASR scores of a level, summed one request at a time (see ``DEFINITIONS["asr"]``)."""

    def __init__(self) -> None:
        self.unscored = 0
        self.languages: Counter[str] = Counter()
        #: metric -> [utterances, sum of rates, errors, reference length, substitutions, deletions, insertions]
        self.totals: dict[str, list[float]] = {}

    def add(self, accuracy: Mapping[str, Any] | None) -> None:
        if accuracy is None:
            self.unscored += 1
            return
        self.languages[accuracy["language"]] += 1
        total = self.totals.setdefault(accuracy["metric"], [0, 0.0, 0, 0, 0, 0, 0])
        keys = ("rate", "errors", "reference_length", "substitutions", "deletions", "insertions")
        total[0] += 1
        for index, key in enumerate(keys, start=1):
            total[index] += accuracy[key]

    def summary(self) -> dict[str, Any]:
        scored = sum(self.languages.values())
        out: dict[str, Any] = {
            "normalizer": "whisper",
            "scored": scored,
            "unscored": self.unscored,
            "unscored_reason": "no reference transcript" if self.unscored else None,
            "languages": dict(sorted(self.languages.items())),
        }
        for metric, (unit, units) in _UNITS.items():
            count, rates, errors, length, subs, dels, ins = self.totals.get(metric, [0, 0.0, 0, 0, 0, 0, 0])
            out.update(
                {
                    f"{metric}_utterances": count,
                    f"{metric}_mean": rates / count if count else None,
                    f"{metric}_corpus": errors / length if length else None,
                    f"{unit}_errors": errors,
                    units: length,
                    f"{unit}_substitutions": subs,
                    f"{unit}_deletions": dels,
                    f"{unit}_insertions": ins,
                }
            )
        return out


class LevelStats:
    """The summary of one level, built one record at a time as records complete.

    Memory per request is a few 8-byte numbers (and one per chunk gap): no record is kept.
    """

    def __init__(self, level: Level, *, stream: bool, family: str, slo: Slo | None) -> None:
        self.level = level
        self.stream = stream
        self.family = family
        self.slo = SloTally(slo) if slo is not None else None
        self.measured = self.warmup = self.ok = self.zero_output = self.underrun_requests = 0
        #: Measured requests of a closed loop run for a duration that went round its requests again.
        self.repeats = 0
        self.first_send: int | None = None
        self.last_end: int | None = None
        self.busy_ns = 0
        self.audio_seconds = 0.0
        #: Characters of the texts spoken (TTS); None once a successful request has no count.
        self.characters: int | None = 0
        self.series = {name: array("d") for name in _SERIES[family if family in _SERIES else "llm"]}
        self.icl = array("d")
        self.lags = array("d")
        self.errors: Counter[str] = Counter()
        self.token_sources: set[str] = set()
        #: Token totals of the successful requests; None once one of them has no count.
        self.input_total: int | None = 0
        self.output_total: int | None = 0
        self.accuracy = [0, 0, 0.0]  # requests scored, exact matches, sum of ROUGE-L F1
        self.scores: dict[str, list[float]] = {}  # name -> [sum, count]
        self.transcripts = TranscriptTotals()

    def metrics(self, rec: Record) -> dict[str, Any] | None:
        """The per-request metrics of a decoded record (None for a failed one): computed once per record, for the
        level's statistics and the record's row in the reports alike."""
        return None if rec.error is not None else request_metrics(rec, stream=self.stream, family=self.family)

    def add(self, rec: Record, metrics: dict[str, Any] | None) -> None:
        """Count one decoded record with its :meth:`metrics` (warmup records only as such)."""
        if rec.warmup:
            self.warmup += 1
            return
        self.measured += 1
        self.repeats += rec.seq >= self.level.warmup + self.level.num_requests
        self.first_send = rec.send_ns if self.first_send is None else min(self.first_send, rec.send_ns)
        self.last_end = rec.end_ns if self.last_end is None else max(self.last_end, rec.end_ns)
        self.busy_ns += rec.end_ns - rec.send_ns
        if rec.scheduled_ns is not None:
            self.lags.append((rec.send_ns - rec.scheduled_ns) / 1e6)
        if self.slo is not None:
            self.slo.add(metrics)
        if rec.error is not None:
            self.errors[rec.error] += 1
            return
        assert metrics is not None, "a successful record comes with its metrics"
        self.ok += 1
        values = metrics
        if self.family == "llm":
            values = {**metrics, "input_tokens": rec.input_tokens, "output_tokens": rec.output_tokens}
            self.input_total = _add(self.input_total, rec.input_tokens)
            self.output_total = _add(self.output_total, rec.output_tokens)
            self.zero_output += rec.output_tokens == 0
            if rec.token_source is not None:
                self.token_sources.add(rec.token_source)
        else:
            self.audio_seconds += metrics["audio_seconds"] or 0.0
            if self.family == "tts":
                self.underrun_requests += bool(metrics["underruns"])
                self.characters = _add(self.characters, metrics["input_characters"])
            else:
                self.transcripts.add(rec.accuracy)
        for name, series in self.series.items():
            if values.get(name) is not None:
                series.append(values[name])
        self.icl.extend(metrics["icl_ms"])
        if "exact_match" in metrics:
            self.accuracy[0] += 1
            self.accuracy[1] += metrics["exact_match"]
            self.accuracy[2] += metrics["rouge_l_f1"]
        for name, value in rec.scores.items():
            total = self.scores.setdefault(name, [0.0, 0])
            total[0] += value
            total[1] += 1

    def _token_source(self) -> str | None:
        """``server``, ``retokenized``, ``mixed``, or None when no request had a token count."""
        if len(self.token_sources) > 1:
            return "mixed"
        return next(iter(self.token_sources), None)

    def summary(self, client_cpu_s: Sequence[float] = (), status: str = "complete") -> dict[str, Any]:
        """The summary of the level (JSON-ready; ``None`` where a metric is not defined)."""
        level, failed = self.level, self.measured - self.ok
        window_s = (self.last_end - self.first_send) / 1e9 if self.measured else 0.0
        summary: dict[str, Any] = {
            "level": level.index,
            "concurrency": level.concurrency,
            "request_rate": level.request_rate,
            "status": status,
            "requests": self.measured,
            "warmup_requests": self.warmup,
            "completed": self.ok,
            "errors": failed,
            "error_rate": failed / self.measured if self.measured else 0.0,
            "input_rows_reused": level.reused_rows + self.repeats,
            "duration_s": window_s,
            "duration_limit_s": level.duration_s,
            "achieved_concurrency": self.busy_ns / 1e9 / window_s if window_s > 0 else None,
            "request_throughput": _per_second(self.ok, window_s),
            "client_cpu_s": sum(client_cpu_s),
            "client_cpu_utilization": max(client_cpu_s) / window_s if client_cpu_s and window_s > 0 else None,
        }
        series = {name: describe(values) for name, values in self.series.items()}
        if self.family == "tts":
            summary.update(
                audio_seconds=self.audio_seconds,
                rtf_aggregate=window_s / self.audio_seconds if self.audio_seconds > 0 else None,
                characters_per_second=_per_second(self.characters if self.ok else None, window_s),
                first_chunk_ms=series["first_chunk_ms"],
                second_chunk_ms=series["second_chunk_ms"],
                e2e_ms=series["e2e_ms"],
                rtf=series["rtf"],
                underrun_requests=self.underrun_requests if self.stream else None,
            )
        elif self.family == "asr":
            summary.update(
                audio_seconds=self.audio_seconds,
                rtf_aggregate=window_s / self.audio_seconds if self.audio_seconds > 0 else None,
                audio_seconds_per_second=_per_second(self.audio_seconds, window_s),
                first_partial_ms=series["first_partial_ms"],
                e2e_ms=series["e2e_ms"],
                rtf=series["rtf"],
                asr=self.transcripts.summary(),
            )
        else:
            output_total = self.output_total if self.ok else None
            input_total = self.input_total if self.ok else None
            summary.update(
                token_source=self._token_source(),
                output_token_throughput=_per_second(output_total, window_s),
                zero_output_requests=self.zero_output,
                input_token_throughput=_per_second(input_total, window_s),
                **{name: series[name] for name in _SERIES["llm"]},
            )
        summary["icl_ms"] = describe(self.icl)
        summary["goodput"] = _per_second(self.slo.met, window_s) if self.slo is not None else None
        summary.update(
            self.slo.summary()
            if self.slo is not None
            else {"attainment": None, "slo_percentiles": None, "slo_met": None}
        )
        summary["scheduling_lag_ms"] = describe(self.lags)
        scored, exact, rouge = self.accuracy
        summary["accuracy"] = (
            {"requests": scored, "exact_match": exact / scored, "rouge_l_f1": rouge / scored} if scored else None
        )
        summary["scores"] = {name: total / count for name, (total, count) in sorted(self.scores.items())}
        summary["error_messages"] = dict(self.errors.most_common(ERROR_SAMPLES))
        return summary


def _add(total: int | None, value: int | None) -> int | None:
    return None if total is None or value is None else total + value
