"""``trtdeploy perf``: load a served deployment at several concurrency levels (or request rates) and report."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from ..errors import UsageError
from ._options import DeploymentArg, JsonOpt, parse_int_list
from ._output import emit_json, err, out, warn

if TYPE_CHECKING:
    from ..benchmark import PerfSettings


def _parse_rates(text: str) -> list[float]:
    """``5,10`` as numbers (LoadSettings checks that they are > 0)."""
    rates = []
    for item in text.split(","):
        try:
            rates.append(float(item))
        except ValueError:
            raise UsageError(
                f"--request-rate: {item.strip()!r} in {text!r} is not a number", hint="e.g. --request-rate 5,10"
            ) from None
    return rates


def _parse_extra_body(text: str) -> dict[str, Any]:
    """``--extra-body`` as a JSON object."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise UsageError(
            f"--extra-body is not JSON ({exc})", hint="""e.g. --extra-body '{"min_tokens": 128}'"""
        ) from None
    if not isinstance(body, dict):
        raise UsageError(f"--extra-body must be a JSON object, got {text!r}", hint="""e.g. '{"min_tokens": 128}'""")
    return body


def perf(
    deployment: DeploymentArg = None,
    *,
    url: Annotated[
        str | None,
        typer.Option(
            help="Triton's HOST:PORT, the gRPC or HTTP port per --protocol (default: the running server that "
            "`trtdeploy serve` started for DEPLOYMENT; without DEPLOYMENT, the one serving a deployment under the "
            "current folder). A server that trtdeploy did not start here (a remote one) needs --model: its "
            "workload is told from that model's configuration, never from a deployment folder here. --endpoint "
            "openai: the server's http(s)://HOST:PORT or HOST:PORT (a base URL ending in /v1 is taken too)."
        ),
    ] = None,
    protocol: Annotated[
        Literal["grpc", "http"] | None,
        typer.Option(
            help="Triton's grpc (offline or streaming) or http (offline; LLMs stream through Triton's "
            "generate_stream, streaming speech models need grpc; default grpc)."
        ),
    ] = None,
    endpoint: Annotated[
        Literal["triton", "openai"],
        typer.Option(
            help="triton, or openai: an OpenAI-compatible server (trtllm-serve, vLLM, SGLang, ...) at --url, "
            "loaded through /v1/completions or /v1/chat/completions (--api) with the same workloads and reports."
        ),
    ] = "triton",
    api: Annotated[
        Literal["completions", "chat"] | None,
        typer.Option(
            help="--endpoint openai: completions (the prompt as it is; the default) or chat (the prompt as one user "
            "turn, in the model's chat template)."
        ),
    ] = None,
    extra_body: Annotated[
        str | None,
        typer.Option(
            help="--endpoint openai: a JSON object merged into every request's body, over the fields perf sets: "
            "the server's own fields, e.g. '{\"min_tokens\": 128}' (vLLM) or '{\"top_k\": 1}'."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Triton model to load (default: the deployment's entry model; e.g. tensorrt_llm). --endpoint "
            "openai: the served model's name (default: the only one its /v1/models lists)."
        ),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(
            help="A remote server (--url with no deployment folder here): load --model with this installed model's "
            "workload (e.g. qwen_llm, spark_tts, cosyvoice2, whisper; tensorrt_llm: the LLM contract, token ids in "
            "and out) instead of the one that recognizes the model's configuration."
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="The LLM's Hugging Face tokenizer, a folder or a Hub name (only its tokenizer files are "
            "downloaded), for a server with no deployment folder here (a remote Triton, --endpoint openai): to make "
            "synthetic prompts of exactly --isl tokens and count tokens (an OpenAI-compatible server's own usage "
            "counts first); needed for synthetic inputs and the LLM contract. Whisper: for --ignore-eos without "
            "--osl."
        ),
    ] = None,
    stream: Annotated[
        bool | None,
        typer.Option(
            "--stream/--no-stream",
            help="Stream responses (default: when the model is decoupled; --endpoint openai: stream).",
        ),
    ] = None,
    concurrency: Annotated[
        str | None, typer.Option("--concurrency", "-c", help="Closed-loop levels, e.g. 1,2,4 (default 1).")
    ] = None,
    request_rate: Annotated[
        str | None, typer.Option(help="Open-loop levels in requests/s (Poisson arrivals unless --arrival), e.g. 5,10.")
    ] = None,
    arrival: Annotated[
        Literal["poisson", "gamma", "constant"],
        typer.Option(
            help="How open-loop requests are spaced: Poisson, gamma gaps (see --burstiness), or one every "
            "1/rate seconds."
        ),
    ] = "poisson",
    burstiness: Annotated[
        float,
        typer.Option(
            help="--arrival gamma: the gaps' shape; below 1 burstier than Poisson (their coefficient of variation "
            "is 1/sqrt(burstiness)), above 1 steadier."
        ),
    ] = 1.0,
    max_concurrency: Annotated[
        int,
        typer.Option(
            help="Open loop: at most this many requests in flight (0: no cap); a request due meanwhile waits for "
            "one to end, and its wait counts as scheduling lag. With --workers, each process caps its share (the "
            "cap split among them, the requests in proportion)."
        ),
    ] = 0,
    num_requests: Annotated[
        int | None,
        typer.Option(
            help="Measured requests per level (default: max(4 x concurrency, or 10 s of a rate, and the input rows "
            "left after the warmups divided among the levels); synthetic inputs make a prompt of their own for "
            "every request, at least 16 per level). With --find, the least a searched level sends."
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            help="Seconds each level sends its measured requests for, instead of a request count. Closed loop: the "
            "slots go on until then, cycling through the level's input rows (counted in input_rows_reused); open "
            "loop: the arrivals due within it (one still waiting for a --max-concurrency slot then is not sent). "
            "No request is sent after it, and the requests in flight are waited for (at most --timeout), not "
            "cancelled: a cancelled request would count as failed and leave the slowest out of the latencies."
        ),
    ] = None,
    warmup: Annotated[
        int | None, typer.Option(help="Unmeasured requests before each level (default: the concurrency; 0 for rates).")
    ] = None,
    reuse_rows: Annotated[
        bool,
        typer.Option(
            "--reuse-rows",
            help="Start every level (its warmup too) at the first input row, so levels and warmups repeat prompts: "
            "for prefix-cache studies. Default: every request of the run takes the next fresh row.",
        ),
    ] = False,
    workers: Annotated[int, typer.Option(help="Client processes sharing the load (when one core is not enough).")] = 1,
    input_data: Annotated[
        Path | None,
        typer.Option(
            help='Inputs file. LLMs: jsonl, one {"input": ..., "output": ...} per line. TTS: jsonl of '
            "reference_audio, reference_text, target_text, or a seed-tts-eval folder or meta.lst. ASR: jsonl of "
            "audio (a path), text (the reference), optional language, or a Kaldi folder (wav.scp + text or trans.txt)."
        ),
    ] = None,
    dataset: Annotated[
        str | None, typer.Option(help="Hugging Face dataset: Hub name or local folder/.json/.jsonl/.csv/.parquet.")
    ] = None,
    split: Annotated[str | None, typer.Option(help="Dataset split (default: the only one).")] = None,
    column: Annotated[
        str | None,
        typer.Option(help="Dataset column of the prompts (default: input, text, prompt or question; ASR: audio)."),
    ] = None,
    reference_column: Annotated[
        str | None,
        typer.Option(
            help="Dataset column of expected outputs, for accuracy (default: output; ASR: text, sentence or "
            "transcription)."
        ),
    ] = None,
    isl: Annotated[
        int | None,
        typer.Option(
            help="Synthetic prompts of exactly ISL tokens, the default input (default: 128, or the deployment's "
            "max_input_len if smaller; more is refused)."
        ),
    ] = None,
    osl: Annotated[
        int | None,
        typer.Option(
            help="Tokens to generate per request (LLMs' default: 128, or the deployment's max_output_len if smaller; "
            "more is refused). ASR: the transcript's length cap (MAX_NEW_TOKENS), none by default."
        ),
    ] = None,
    isl_stddev: Annotated[
        float,
        typer.Option(
            help="Synthetic LLM prompts: each one's length drawn from a normal distribution around --isl with this "
            "standard deviation (clipped to the deployment's max_input_len, and at least one token beyond what its "
            "preprocessing adds)."
        ),
    ] = 0.0,
    osl_stddev: Annotated[
        float,
        typer.Option(
            help="Each synthetic request's output length drawn around --osl with this standard deviation (clipped "
            "to 1..max_output_len)."
        ),
    ] = 0.0,
    osl_from_reference: Annotated[
        bool,
        typer.Option(
            "--osl-from-reference",
            help="LLMs, with --input-data or --dataset: each request asks for as many tokens as its row's reference "
            "output has (counted with the deployment's tokenizer; at least 1, at most max_output_len), with "
            "--ignore-eos so that it gets them. A row without a reference is refused.",
        ),
    ] = False,
    shared_prefixes: Annotated[
        int,
        typer.Option(
            help="Synthetic LLM prompts that share prefixes, to measure KV-cache reuse: N prefixes of --prefix-len "
            "tokens, request i starting with prefix i mod N, then --isl tokens of its own (those the deployment "
            "adds, such as BOS or the chat template, counted in them)."
        ),
    ] = 0,
    prefix_len: Annotated[
        int | None,
        typer.Option(help="--shared-prefixes: the tokens of each prefix (the model sees --prefix-len + --isl)."),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Replay a trace in the format of the public Mooncake traces: a jsonl of {timestamp (ms), "
            "input_length, output_length, hash_ids} per request. One open-loop level sends each request at its "
            "time after the first (with --num-requests or --duration, the first ones), with a prompt of its "
            "length made of the blocks its hash_ids name (requests naming a block share it) and its output length "
            "(with --ignore-eos); lengths beyond the deployment's limits are clipped to them."
        ),
    ] = None,
    trace_speedup: Annotated[
        float, typer.Option(help="--trace: replay this many times faster (2: every gap halved).")
    ] = 1.0,
    trace_block_size: Annotated[
        int | None,
        typer.Option(help="--trace: the tokens of a block of hash_ids (default 512, as in the Mooncake traces)."),
    ] = None,
    ignore_eos: Annotated[
        bool,
        typer.Option(
            "--ignore-eos",
            help="Generate past end-of-sequence: exactly --osl tokens, or each request's drawn length with "
            "--osl-stddev (end_id -1; ASR: IGNORE_EOS, and without --osl each row's max_tokens).",
        ),
    ] = False,
    temperature: Annotated[
        float | None,
        typer.Option(
            help="Sampling temperature, >= 0 (0: greedy). Without --top-k/--top-p it samples from the whole "
            "distribution: top_p 1.0 is sent (TRT-LLM decodes greedily when top_k and top_p are both 0)."
        ),
    ] = None,
    top_k: Annotated[int | None, typer.Option(help="Sample from the K most likely tokens (0: off).")] = None,
    top_p: Annotated[
        float | None, typer.Option(help="Sample from the most likely tokens holding probability P, 0 < P <= 1.")
    ] = None,
    text_prefix: Annotated[
        str | None,
        typer.Option(
            help="ASR: Whisper's decoder prompt (TEXT_PREFIX) for every request, e.g. "
            "'<|startoftranscript|><|zh|><|transcribe|><|notimestamps|>' (default: each input row's language, "
            "else the one its reference is written in, else English); its language is the one scored."
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of synthetic prompts, arrivals, and sampling (with --temperature).")
    ] = 0,
    slo: Annotated[
        str | None,
        typer.Option(
            help="Service-level objectives, all to be met: KEY<=LIMIT,... over ttft_ms, itl_ms, e2e_ms (LLMs), "
            "first_chunk_ms, e2e_ms, rtf (TTS) or first_partial_ms, e2e_ms, rtf (ASR), in ms but the RTF. A key "
            "bounds every request (its share meeting them all is the level's attainment, those per second its "
            "goodput); with a percentile suffix it bounds the level: ttft_ms_p90<=200 (90% of its requests within "
            "200 ms). A request without a value (failed; LLMs: no token) meets no limit on it."
        ),
    ] = None,
    attainment: Annotated[
        float | None,
        typer.Option(
            help="--slo: the share of a level's requests that must meet every per-request limit for the level to "
            "meet the SLO (default 0.95)."
        ),
    ] = None,
    find: Annotated[
        Literal["max-concurrency", "max-rate"] | None,
        typer.Option(
            help="Search for the highest concurrency (closed loop, from --concurrency, default 1) or request rate "
            "(open loop, from --request-rate) at which a level meets --slo: doubling until a level misses it (at "
            "most 10 times; halving instead when the first misses), then bisection down to neighbouring "
            "concurrencies or rates 5% apart. Every level searched is measured and written like any other."
        ),
    ] = None,
    max_error_rate: Annotated[
        float, typer.Option(help="Fail (exit 6) when a level's share of failed requests exceeds this.")
    ] = 0.0,
    timeout: Annotated[float, typer.Option(help="Seconds a request may take before it counts as failed.")] = 600.0,
    metrics_url: Annotated[
        str | None, typer.Option(help="Triton's Prometheus URL (default: the server's, or port 8002 of --url).")
    ] = None,
    output_dir: Annotated[
        Path | None, typer.Option(help="Where reports go (default: perf-results/<model>-<timestamp>/).")
    ] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write latency and throughput plots.")] = True,
    asr: Annotated[
        str | None,
        typer.Option(
            "--asr",
            help="TTS: transcribe the generated speech with Whisper and report WER/CER against the target texts "
            "(seed-tts-eval's rules). A whisper deployment folder (served by `trtdeploy serve`), or the gRPC "
            "HOST:PORT of a Triton with NVIDIA's whisper_bls contract (TEXT_PREFIX, WAV, WAV_LENS -> TRANSCRIPTS).",
        ),
    ] = None,
    asr_url: Annotated[str | None, typer.Option(hidden=True, help="Deprecated: the same as --asr.")] = None,
    asr_model: Annotated[
        str | None,
        typer.Option(
            help="The Whisper model's name for --asr (default: whisper_bls; of a streaming whisper deployment, "
            "whisper_bls_offline)."
        ),
    ] = None,
    asr_language: Annotated[
        str | None, typer.Option(help="en or zh for every utterance (default: told from each target text).")
    ] = None,
    json: JsonOpt = False,
) -> None:
    """Benchmark a served deployment per concurrency level or request rate: TTFT, ITL, latency and throughput (TTS:
    first-chunk latency, RTF, saved audio, WER/CER with --asr; ASR: latency, RTF, WER/CER of the transcripts)."""
    settings = perf_settings(locals())
    from ..benchmark import benchmark
    from ..perf.report import LiveProgress, print_table, search_result
    from ..server import stop_signals_as_interrupt

    with stop_signals_as_interrupt(), LiveProgress(err) as progress:  # SIGTERM keeps the results as Ctrl-C does
        run = benchmark(settings, progress=progress, warn=warn)
    if json:
        emit_json(run.summary)
    else:
        print_table(out, run.summary)
        found = search_result(run.summary)
        if found is not None:
            out.print(found, highlight=False)
        out.print(f"reports: {run.output_dir}")
    run.check_error_rate(max_error_rate)


def perf_settings(options: Mapping[str, Any]) -> PerfSettings:
    """The settings that ``perf``'s options ask for (by parameter name), checked; ``sweep`` passes the same options,
    with its own ``deployment``, ``url``, ``metrics_url`` and ``output_dir`` for each point."""
    from ..benchmark import PerfSettings, resolve_asr
    from ..perf.runner import InputSpec, LoadSettings
    from ..perf.slo import Slo
    from ..perf.trace import Trace
    from ..perf.workload import RequestOptions

    o = options
    levels = parse_int_list(o["concurrency"] or "1", name="--concurrency")
    if o["concurrency"] is not None and o["request_rate"] is not None:
        raise UsageError(
            "--concurrency and --request-rate are exclusive",
            hint="choose a closed loop (--concurrency) or an open loop (--request-rate)",
        )
    language, asr = o["asr_language"], o["asr"]
    if language not in (None, "en", "zh"):
        raise UsageError(f"--asr-language must be en or zh, got {language!r}")
    if asr is not None and o["asr_url"] is not None:
        raise UsageError("--asr and --asr-url are the same option", hint="pass --asr only")
    if o["asr_url"] is not None:
        warn("--asr-url is deprecated: pass --asr HOST:PORT (or --asr WHISPER_DEPLOYMENT_FOLDER)")
        asr = o["asr_url"]
    if o["endpoint"] == "openai" and o["protocol"] is not None:
        raise UsageError("--protocol chooses Triton's gRPC or HTTP", hint="leave it out with --endpoint openai")
    if o["attainment"] is not None and o["slo"] is None:
        raise UsageError("--attainment is the share of requests that must meet --slo", hint="pass --slo too")
    if not 0.0 <= o["max_error_rate"] <= 1.0:
        raise UsageError(f"--max-error-rate must be between 0 and 1, got {o['max_error_rate']:g}", hint="e.g. 0.01")
    trace = None
    if o["trace"] is not None:
        if o["concurrency"] is not None or o["request_rate"] is not None:
            raise UsageError(
                "--trace sends its requests at the trace's times, as one open-loop level",
                hint="leave out --concurrency and --request-rate",
            )
        trace = Trace.load(o["trace"], speedup=o["trace_speedup"], block_size=o["trace_block_size"])
    elif o["trace_speedup"] != 1.0 or o["trace_block_size"] is not None:
        raise UsageError("--trace-speedup and --trace-block-size go with --trace")
    return PerfSettings(
        deployment=o["deployment"],
        url=o["url"],
        protocol=o["protocol"] or "grpc",
        endpoint=o["endpoint"],
        api=o["api"],
        tokenizer=o["tokenizer"],
        extra_body=_parse_extra_body(o["extra_body"]) if o["extra_body"] is not None else None,
        metrics_url=o["metrics_url"],
        model=o["model"],
        stream=o["stream"],
        load=LoadSettings(
            concurrency=tuple(levels),
            request_rates=tuple(_parse_rates(o["request_rate"])) if o["request_rate"] else (),
            num_requests=o["num_requests"],
            warmup=o["warmup"],
            workers=o["workers"],
            timeout_s=o["timeout"],
            seed=o["seed"],
            reuse_rows=o["reuse_rows"],
            arrival=o["arrival"],
            burstiness=o["burstiness"],
            max_concurrency=o["max_concurrency"],
            duration_s=o["duration"],
            find=o["find"],
            schedule_ns=trace.schedule_ns() if trace is not None else (),
        ),
        inputs=InputSpec(
            input_data=o["input_data"],
            dataset=o["dataset"],
            split=o["split"],
            column=o["column"],
            reference_column=o["reference_column"],
            isl=o["isl"],
            osl=o["osl"],
            isl_stddev=o["isl_stddev"],
            osl_stddev=o["osl_stddev"],
            shared_prefixes=o["shared_prefixes"],
            prefix_len=o["prefix_len"],
            osl_from_reference=o["osl_from_reference"],
            trace=trace,
        ),
        options=RequestOptions(
            max_tokens=o["osl"],
            # the lengths of the references and of a trace are those generated: past end-of-sequence if need be
            ignore_eos=o["ignore_eos"] or o["osl_from_reference"] or trace is not None,
            temperature=o["temperature"],
            top_k=o["top_k"],
            top_p=o["top_p"],
            seed=o["seed"] if o["temperature"] is not None else None,
            text_prefix=o["text_prefix"],
        ),
        slo=Slo.parse(o["slo"], o["attainment"]) if o["slo"] is not None else None,
        output_dir=o["output_dir"],
        plots=o["plots"],
        asr=resolve_asr(asr, model=o["asr_model"], language=language) if asr is not None else None,
        workload=o["workload"],
    )
