"""The torch engine's runtime on the CPU, without Triton: exactness against transformers, sampling, batching, errors."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import numpy as np  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from trtdeploy.engines.torch.runtime import (  # noqa: E402
    NEVER_STOP,
    DecoderModel,
    GenerationRequest,
    Generator,
    GeneratorConfig,
    SamplingParams,
    SamplingPlan,
    SequenceOutput,
    SlotSampler,
    load_generator,
    response_arrays,
    sampling,
    special_tokens,
    uniform_noise,
)

from .contract_helpers import RecordingSink  # noqa: E402
from .torch_helpers import write_tiny_model  # noqa: E402

MAX_SEQ_LEN = 96
MAX_INPUT_LEN = 48
SAMPLED = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1234)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("qwen2"), "qwen2")


@pytest.fixture(scope="module")
def hf_model(qwen2_dir):
    return AutoModelForCausalLM.from_pretrained(qwen2_dir).eval()


@pytest.fixture(scope="module")
def generator(qwen2_dir):
    gen = load_generator(qwen2_dir, max_slots=16, max_input_len=MAX_INPUT_LEN, max_seq_len=MAX_SEQ_LEN)
    yield gen
    gen.close()


def prompts_of(lengths, seed=0, vocab=512):
    rng = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=rng).tolist() for length in lengths]


def hf_greedy(model, prompt, new_tokens):
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def run_all(gen, requests):
    """Submit every request at once; wait for all; return the sinks."""
    sinks = [RecordingSink() for _ in requests]
    for request, sink in zip(requests, sinks, strict=True):
        gen.submit(request, sink)
    for sink in sinks:
        sink.wait()
    return sinks


def greedy(prompt, new_tokens, **kwargs):
    return GenerationRequest([prompt], new_tokens, end_id=NEVER_STOP, **kwargs)


def hf_logits(model, ids):
    """transformers' float32 logits at every position of ``ids``."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


# --- (a) exactness against transformers ------------------------------------------------------------------------


def test_concurrent_greedy_equals_hf_generate(generator, hf_model):
    prompts = prompts_of([1, 4, 9, 17, 33, 48])
    sinks = run_all(generator, [greedy(prompt, 14) for prompt in prompts])
    for prompt, sink in zip(prompts, sinks, strict=True):
        assert sink.error is None
        assert sink.tokens == hf_greedy(hf_model, prompt, 14)


def test_padded_prefill_gives_the_same_tokens(generator, hf_model, monkeypatch):
    monkeypatch.setattr(generator.model, "pad_prefill", True)  # what CUDA graphs replay, run eagerly here
    prompts = prompts_of([2, 7, 19], seed=17)
    sinks = run_all(generator, [greedy(prompt, 6) for prompt in prompts])
    assert [sink.tokens for sink in sinks] == [hf_greedy(hf_model, prompt, 6) for prompt in prompts]


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
def test_other_architectures_equal_hf_generate(tmp_path, architecture):
    model_dir = write_tiny_model(tmp_path / architecture, architecture, seed=3)
    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    gen = load_generator(model_dir, max_slots=4, max_input_len=32, max_seq_len=64)
    try:
        prompts = prompts_of([3, 11, 25], seed=1)
        sinks = run_all(gen, [greedy(prompt, 10) for prompt in prompts])
        assert [sink.tokens for sink in sinks] == [hf_greedy(hf, prompt, 10) for prompt in prompts]
    finally:
        gen.close()


# --- (b) logits of prefill and decode --------------------------------------------------------------------------


@pytest.mark.parametrize("pad_prefill", [False, True], ids=["exact", "padded"])
def test_prefill_and_decode_logits_match_hf_forward(qwen2_dir, hf_model, pad_prefill):
    model = DecoderModel.from_pretrained(
        str(qwen2_dir), dtype=torch.float32, device="cpu", max_slots=8, max_seq_len=MAX_SEQ_LEN, cuda_graphs=False
    )
    model.pad_prefill = pad_prefill  # padded: 3 prompts become 4 rows of 16 tokens, one row in the scratch slot
    prompts = prompts_of([5, 12, 3], seed=2)
    slots = [5, 1, 3]  # out of order, with idle slots around them: those are masked in the decode step
    sequences = [list(prompt) for prompt in prompts]

    def check_and_extend(logits):
        with torch.no_grad():
            for row, sequence in enumerate(sequences):
                expected = hf_model(torch.tensor([sequence])).logits[0, -1]
                torch.testing.assert_close(logits[row], expected, atol=1e-4, rtol=1e-4)
        chosen = logits.argmax(-1)
        for sequence, token in zip(sequences, chosen.tolist(), strict=True):
            sequence.append(token)
        return chosen

    chosen = check_and_extend(model.prefill(prompts, slots))
    model.start(slots, chosen.tolist(), [len(prompt) for prompt in prompts])
    for _ in range(6):
        batch, span = model.buckets(max(slots) + 1, max(len(sequence) for sequence in sequences))
        chosen = check_and_extend(model.decode(batch, span)[slots].float())
        fed = torch.zeros(batch, dtype=torch.long)
        fed[slots] = chosen
        model.advance(batch, fed)


# --- (c) sampling ----------------------------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(generator, hf_model):
    prompt = prompts_of([10], seed=4)[0]
    alone = run_all(generator, [greedy(prompt, 16, sampling=SAMPLED)])[0].tokens
    others = prompts_of([3, 20, 7, 30], seed=5)
    crowd = [
        greedy(others[0], 20),
        greedy(others[1], 20, sampling=SamplingParams(temperature=1.0, top_p=0.5, seed=7)),  # full-sort path
        greedy(others[2], 20, sampling=SamplingParams(temperature=1.3, top_p=1.0, seed=8)),  # full-vocab path
        greedy(prompt, 16, sampling=SAMPLED),
        greedy(others[3], 20, sampling=SamplingParams(top_k=5, repetition_penalty=1.3, seed=9)),
    ]
    together = run_all(generator, crowd)
    assert together[3].tokens == alone
    assert alone != hf_greedy(hf_model, prompt, 16)
    reseeded = run_all(generator, [greedy(prompt, 16, sampling=SamplingParams(0.8, 20, 0.9, seed=99))])[0].tokens
    assert reseeded != alone


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=0.0, top_k=50), SamplingParams(top_k=1), SamplingParams(top_k=0, top_p=0)]
)
def test_greedy_settings_give_the_argmax(generator, hf_model, params):
    prompt = prompts_of([6], seed=6)[0]
    assert run_all(generator, [greedy(prompt, 8, sampling=params)])[0].tokens == hf_greedy(hf_model, prompt, 8)


def test_sampler_respects_top_k_and_top_p():
    vocab = 64
    sampler = SlotSampler(4, vocab, torch.device("cpu"))
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    params = [
        SamplingParams(top_k=3, seed=1),
        SamplingParams(top_p=0.5, seed=2),
        SamplingParams(temperature=1.0, top_p=1.0, seed=3),
        SamplingParams(top_k=4, top_p=0.3, seed=4),
    ]
    sampler.assign([0, 1, 2, 3], params, [[1]] * 4)
    seen: list[set[int]] = [set() for _ in params]
    for counter in range(300):
        chosen = sampler.sample(logits, [0, 1, 2, 3], torch.full((4,), counter)).tolist()
        for row, token in enumerate(chosen):
            seen[row].add(token)
    probs = torch.softmax(logits, -1)
    order = probs.argsort(-1, descending=True)

    def nucleus(row, p):
        mass = probs[row, order[row]].cumsum(0) - probs[row, order[row]]
        return set(order[row][mass < p].tolist())

    assert seen[0] <= set(order[0, :3].tolist()) and len(seen[0]) > 1
    assert seen[1] <= nucleus(1, 0.5) and len(seen[1]) > 1
    assert len(seen[2]) > 10  # plain temperature sampling reaches far
    top4 = torch.softmax(logits[3, order[3, :4]], 0)
    assert seen[3] <= set(order[3, : int((top4.cumsum(0) - top4 < 0.3).sum())].tolist())


class ReplayingCapture:
    """What the model's CUDA graph capture promises the sampler: each capture computes once into an output that
    ``replay()`` recomputes in place (from the buffers as they are then)."""

    def __init__(self):
        self.captured = 0

    def __call__(self, forward):
        output = forward()
        self.captured += 1

        class Replay:
            def replay(self):
                output.copy_(forward())

        return Replay(), output


def test_decode_sampling_matches_per_slot_sampling_and_replays_one_capture_per_plan():
    vocab = 300
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1))
    counters = torch.tensor([5, 9, 2, 7])
    params = [
        SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=11),
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=3, seed=12),
        SamplingParams(top_k=20, repetition_penalty=1.3, seed=13),
    ]
    capture = ReplayingCapture()
    cpu = torch.device("cpu")
    reference, decoding = SlotSampler(4, vocab, cpu), SlotSampler(4, vocab, cpu, capture)
    for sampler in (reference, decoding):
        sampler.assign([0, 1, 2, 3], params, [[1, 2]] * 4)
    for _ in range(3):
        expected = reference.sample(logits, [0, 1, 2, 3], counters)
        assert decoding.sample_decode(logits, counters).tolist() == expected.tolist()
        counters += 1  # in place, like the model's positions buffer the graph reads
    assert capture.captured == 1
    assert torch.equal(reference.counts, decoding.counts)  # the penalties' counts of seen tokens are kept alike
    assert SamplingPlan.of(params, vocab) == SamplingPlan(penalised=True, draws=True, width=64, nucleus=True)
    decoding.release(3)
    decoding.sample_decode(logits, counters)
    assert capture.captured == 2  # a new plan (no penalty any more) is a new capture


def test_uniform_noise_is_a_pure_function_and_well_spread():
    ids = torch.arange(20000).expand(2, -1)
    first = uniform_noise(torch.tensor([5, 5]), torch.tensor([0, 1]), ids)
    again = uniform_noise(torch.tensor([5]), torch.tensor([1]), ids[:1])
    assert torch.equal(first[1], again[0])
    assert not torch.equal(first[0], first[1])
    # strictly inside (0, 1) for every hash, so the Gumbel noise is finite: at 1.0 it is +inf and would win over any
    # logit, a banned one too (seed 25, counter 0 drew it over a 152k vocabulary when 24 bits were kept)
    wide = uniform_noise(torch.tensor([25] * 8), torch.arange(8), torch.arange(152000).expand(8, -1))
    assert 0.0 < wide.min() and wide.max() < 1.0
    assert torch.isfinite(
        sampling.gumbel_noise(torch.tensor([25] * 8), torch.arange(8), torch.arange(152000).expand(8, -1))
    ).all()
    assert 0 < first.min() and first.max() < 1
    assert abs(first.mean().item() - 0.5) < 0.01
    assert abs(first.var().item() - 1 / 12) < 0.005


# --- (d) stopping, lengths, output layout ----------------------------------------------------------------------


def test_end_id_stops_before_the_end_token_and_minus_one_never_stops(generator, hf_model):
    prompt = prompts_of([8], seed=7)[0]
    reference = hf_greedy(hf_model, prompt, 20)
    stop = reference[5]
    stopped, full = run_all(
        generator, [GenerationRequest([prompt], 20, end_id=stop), GenerationRequest([prompt], 20, end_id=NEVER_STOP)]
    )
    assert stopped.tokens == reference[: reference.index(stop)]
    assert full.tokens == reference


def test_default_end_ids_come_from_the_checkpoint(qwen2_dir, hf_model):
    assert special_tokens(qwen2_dir) == (frozenset({2}), 2)
    prompt = prompts_of([8], seed=7)[0]
    reference = hf_greedy(hf_model, prompt, 20)
    model = DecoderModel.from_pretrained(
        str(qwen2_dir), dtype=torch.float32, device="cpu", max_slots=2, max_seq_len=64, cuda_graphs=False
    )
    gen = Generator(model, GeneratorConfig(max_input_len=32, end_ids=frozenset({reference[4]})))
    try:
        for end_id in (None, -2):  # missing, or negative but not -1: the checkpoint's end ids
            assert run_all(gen, [GenerationRequest([prompt], 20, end_id=end_id)])[0].tokens == reference[:4]
    finally:
        gen.close()


def test_output_len_is_capped_by_max_seq_len(generator):
    prompt = prompts_of([40], seed=8)[0]
    sink = run_all(generator, [greedy(prompt, 1000)])[0]
    assert len(sink.tokens) == MAX_SEQ_LEN - 40


def test_streaming_sends_new_tokens_then_a_final(generator, hf_model):
    prompt = prompts_of([5], seed=9)[0]
    sink = run_all(generator, [greedy(prompt, 6, streaming=True)])[0]
    assert [token for chunk in sink.streamed for token in chunk] == hf_greedy(hf_model, prompt, 6)
    assert all(sink.streamed) and sink.outputs is None and sink.finals == 1


def test_a_sender_that_falls_behind_merges_each_sequences_tokens():
    """Events queued while responses went out: one send per sequence, its tokens in order, finals after them."""
    from trtdeploy.engines.torch.runtime.generator import coalesce_tokens

    class Sink:
        def __init__(self):
            self.calls = []

        def send_tokens(self, tokens):
            self.calls.append(("tokens", tokens.index, list(tokens), tokens.log_probs))

        def send_final(self, outputs):
            self.calls.append(("final", outputs))

    def piece(token, index=0):
        return SequenceOutput([token], index=index, log_probs=[-token / 10], cum_log_prob=-token)

    a, b = Sink(), Sink()
    events = [
        (a.send_tokens, (piece(1),), False), (b.send_tokens, (piece(7),), True), (a.send_tokens, (piece(2),), True),
        (b.send_tokens, (piece(8),), True), (a.send_tokens, (piece(5, index=1),), True),
        (a.send_tokens, (piece(3),), True), (a.send_final, (None,), False), (b.send_tokens, (piece(9),), True),
    ]  # fmt: skip
    merged = coalesce_tokens(events)
    for send, args, _ in merged:
        send(*args)
    assert a.calls == [
        ("tokens", 0, [1], [-0.1]),  # a's first token went out alone
        ("tokens", 0, [2, 3], [-0.2, -0.3]),
        ("tokens", 1, [5], [-0.5]),  # another sequence of the same request is another stream
        ("final", None),
    ]
    assert b.calls == [("tokens", 0, [7, 8, 9], [-0.7, -0.8, -0.9])]
    assert merged[1][1][0].cum_log_prob == -9  # the running sum of the latest piece
    assert events[1][1][0] == [7]  # the queued events themselves are left as they were


def test_a_request_with_several_prompts_and_the_input_included(generator, hf_model):
    prompts = prompts_of([4, 9], seed=10)
    request = GenerationRequest(prompts, 5, end_id=NEVER_STOP, exclude_input=False)
    sink = run_all(generator, [request])[0]
    assert sink.outputs == [prompt + hf_greedy(hf_model, prompt, 5) for prompt in prompts]
    assert [(output.row, output.index, output.prompt_tokens) for output in sink.outputs] == [(0, 0, 4), (1, 0, 9)]
    second = response_arrays(request, sink.outputs[1])  # each sequence in its own response, tagged with its row
    assert second["output_ids"].tolist() == [[sink.outputs[1]]] and second["sequence_length"].tolist() == [[14]]
    assert second["batch_index"].tolist() == [[1]]
    assert set(second) == {"output_ids", "sequence_length", "batch_index"}  # nothing else was asked for


# --- (e) continuous batching -----------------------------------------------------------------------------------


def test_a_sequence_that_fills_max_seq_len_leaves_its_slot_inside_the_cache(qwen2_dir):
    """The step after a sequence's last token still runs its slot (the loop queues it before reading that token):
    a sequence that filled its room, in a slot below one that runs on, must not take later steps past the cache."""
    gen = load_generator(qwen2_dir, max_slots=4, max_input_len=48, max_seq_len=96)
    try:
        filling, short = prompts_of([40, 4], seed=21)
        alone = run_all(gen, [greedy(short, 1000)])[0].tokens
        sinks = run_all(gen, [greedy(filling, 1000), greedy(short, 1000)])
        assert [sink.error for sink in sinks] == [None, None]
        assert [len(sink.tokens) for sink in sinks] == [96 - 40, 96 - 4]
        assert sinks[1].tokens == alone
    finally:
        gen.close()


def test_concurrent_requests_share_decode_steps(generator):
    prompts = prompts_of([5 + i for i in range(12)], seed=11)
    steps = generator.steps
    generator.peak_batch = 0
    sinks = run_all(generator, [greedy(prompt, 10) for prompt in prompts])
    assert all(len(sink.tokens) == 10 for sink in sinks)
    assert generator.peak_batch >= 8
    assert generator.steps - steps < 40  # one at a time would take 12 x 9 steps


def test_more_requests_than_slots_reuse_freed_slots(generator):
    prompts = prompts_of([3 + (i % 7) for i in range(40)], seed=12)
    alone = [run_all(generator, [greedy(prompt, 6)])[0].tokens for prompt in prompts[:5]]
    sinks = run_all(generator, [greedy(prompt, 6 + i % 5) for i, prompt in enumerate(prompts)])
    assert [len(sink.tokens) for sink in sinks] == [6 + i % 5 for i in range(40)]
    assert [sink.tokens[:6] for sink in sinks[:5]] == alone


def test_submit_from_many_threads(generator):
    prompts = prompts_of([6] * 16, seed=13)
    sinks = [RecordingSink() for _ in prompts]
    threads = [
        threading.Thread(target=generator.submit, args=(greedy(prompt, 5), sink))
        for prompt, sink in zip(prompts, sinks, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread, sink in zip(threads, sinks, strict=True):
        thread.join()
        assert len(sink.wait().tokens) == 5


# --- (f) errors and cancellation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (GenerationRequest([list(range(3, 3 + MAX_INPUT_LEN + 1))], 4), "exceeds max_input_len 48"),
        (GenerationRequest([[]], 4), "prompt is empty"),
        (GenerationRequest([[5, 512]], 4), "outside the vocabulary"),
        (GenerationRequest([[5]], 0), "request_output_len must be at least 1"),
        (GenerationRequest([[5]], 4, beam_width=2), "beam_width 2: the torch engine decodes one beam (beam_width 1)"),
        (GenerationRequest([[5]], 4, length_penalty=0.5), "length_penalty (len_penalty) 0.5: it scores beam search"),
        (GenerationRequest([[5]], 4, return_perf_metrics=True), "return_perf_metrics true: the torch engine keeps no"),
        (GenerationRequest([[5]], 4, stop_words=((3, 512),)), "stop_words hold a token id outside the vocabulary"),
        (GenerationRequest([[5]], 4, embedding_bias=np.zeros(513, np.float32)), "embedding_bias has shape [513]"),
    ],
)
def test_bad_requests_get_an_error_while_others_complete(generator, request_, message):
    good = prompts_of([7, 3], seed=14)
    sinks = run_all(generator, [greedy(good[0], 6), request_, greedy(good[1], 6)])
    assert message in sinks[1].error
    assert [len(sinks[0].tokens), len(sinks[2].tokens)] == [6, 6]


def test_a_failing_step_fails_its_requests_and_the_loop_goes_on(generator, monkeypatch):
    real_decode = generator.model.decode
    calls = {"n": 0}

    def flaky(batch, span, columns):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real_decode(batch, span, columns)

    monkeypatch.setattr(generator.model, "decode", flaky)
    failed = run_all(generator, [greedy(prompts_of([5], seed=15)[0], 8)])[0]
    assert "decode step failed: boom" in failed.error
    fine = run_all(generator, [greedy(prompts_of([5], seed=16)[0], 8)])[0]
    assert fine.error is None and len(fine.tokens) == 8


def test_cancelled_requests_free_their_slot(qwen2_dir):
    gen = load_generator(qwen2_dir, max_slots=2, max_input_len=16, max_seq_len=MAX_SEQ_LEN, cancel_check_period=0)
    try:
        sink = RecordingSink(cancel_after=3)
        gen.submit(greedy([5, 6, 7], 80, streaming=True), sink)
        assert sink.wait().cancelled_error and len(sink.streamed) < 80
        after = run_all(gen, [greedy([5, 6, 7], 4), greedy([8, 9], 4)])
        assert all(len(s.tokens) == 4 for s in after)
    finally:
        gen.close()


def test_close_fails_requests_in_flight(qwen2_dir):
    gen = load_generator(qwen2_dir, max_slots=1, max_input_len=16, max_seq_len=MAX_SEQ_LEN)
    sinks = [RecordingSink() for _ in range(3)]
    for sink in sinks:
        gen.submit(greedy([5, 6, 7], 90), sink)
    gen.close()
    assert all(sink.done.is_set() for sink in sinks)
    assert any(sink.error == "the model is shutting down" for sink in sinks)


# --- (g) the rest of TRT-LLM's inputs: words, lengths, penalties, sequences, log probs and logits -----------------

CPU = torch.device("cpu")


def test_presence_and_frequency_penalties_count_the_prompt_and_follow_the_temperature():
    """TRT-LLM's penalty kernel: logits scaled by the temperature first, then every token seen (prompt included)
    loses the presence penalty once and the frequency penalty once per occurrence."""
    logits = torch.arange(8, dtype=torch.float32).expand(4, -1)  # token 7 is the best, then 6, 5 ...
    sampler = SlotSampler(4, 8, CPU)
    params = [
        SamplingParams(top_k=1, presence_penalty=10),  # 7 - 10 < 6
        SamplingParams(top_k=1, frequency_penalty=0.6),  # 7 twice, 6 once: 5.8 > 5.4 > 5
        SamplingParams(top_k=1, frequency_penalty=1.1),  # 4.8 < 4.9 < 5
        SamplingParams(top_k=1, temperature=0.5, presence_penalty=1.5),  # 14 - 1.5 > 12 (not (7 - 1.5) / 0.5 < 12)
    ]
    sampler.assign([0, 1, 2, 3], params, [[7], [7, 7, 6], [7, 7, 6], [7]])
    counters = torch.zeros(4, dtype=torch.long)
    assert sampler.sample(logits, [0, 1, 2, 3], counters).tolist() == [6, 7, 5, 7]
    assert sampler.sample(logits, [0, 1, 2, 3], counters).tolist()[1] == 6  # 7 seen a third time: 5.2 < 5.4


def test_an_embedding_bias_and_banned_tokens_change_the_choice_until_released():
    logits = torch.arange(8, dtype=torch.float32).expand(2, -1)
    sampler = SlotSampler(2, 8, CPU)
    sampler.assign([0, 1], [SamplingParams(top_k=1)] * 2, [[1], [1]], biases=[np.array([0, 0, 10], np.float32), None])

    def choose():
        return sampler.sample(logits, [0, 1], torch.zeros(2, dtype=torch.long)).tolist()

    assert choose() == [2, 7]
    sampler.set_bans(1, frozenset({7, 6}))
    assert choose() == [2, 5]
    sampler.set_bans(1, frozenset({6}))
    assert choose() == [2, 7]
    sampler.release(0)
    sampler.release(1)
    assert choose() == [7, 7]


@pytest.mark.parametrize("decode", [False, True], ids=["per-slot", "decode-step"])
def test_a_slot_reused_without_a_bias_forgets_the_bias_of_its_last_request(decode):
    """A step is biased when one of its slots is, and then adds every slot's bias row: a request that brings no
    bias must find its slot's row zero, whichever request had the slot before."""
    logits = torch.arange(8, dtype=torch.float32).expand(2, -1).contiguous()  # token 7 is the best
    counters = torch.zeros(2, dtype=torch.long)
    sampler = SlotSampler(2, 8, CPU, ReplayingCapture() if decode else None)

    def choose():
        return (
            sampler.sample_decode(logits, counters) if decode else sampler.sample(logits, [0, 1], counters)
        ).tolist()

    greedy_params = [SamplingParams(top_k=1)] * 2
    sampler.assign([0, 1], greedy_params, [[1], [1]], biases=[np.array([0, 0, 100], np.float32), None])
    assert choose() == [2, 7]
    sampler.release(0)
    sampler.release(1)
    sampler.assign([0, 1], greedy_params, [[1], [1]], biases=[None, np.array([0, 0, 0, 100], np.float32)])
    assert choose() == [7, 3]  # slot 0's new request has no bias; slot 1's does, so the step adds both rows
    # slot 1 given a request without a bias and no release in between, while slot 0 brings one
    sampler.assign([0, 1], greedy_params, [[1], [1]], biases=[np.array([0, 0, 0, 0, 100], np.float32), None])
    assert choose() == [4, 7]


def test_log_probs_are_taken_in_the_distribution_each_token_was_drawn_from():
    vocab = 64
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(3))
    params = [
        SamplingParams(top_k=4, seed=1),
        SamplingParams(temperature=0.7, top_p=1.0, seed=2),  # the whole vocabulary
        SamplingParams(top_k=1),  # greedy: probability 1
        SamplingParams(top_p=0.5, seed=4),
    ]
    sampler = SlotSampler(4, vocab, CPU)
    sampler.assign([0, 1, 2, 3], params, [[1]] * 4, log_probs=[True] * 4)
    chosen = sampler.sample(logits, [0, 1, 2, 3], torch.full((4,), 9)).tolist()
    found = sampler.log_probs_of([0, 1, 2, 3])

    def among(row, kept, scale=1.0):
        values = torch.full((vocab,), float("-inf"))
        values[kept] = logits[row, kept] / scale
        return torch.log_softmax(values, -1)[chosen[row]].item()

    order = logits.argsort(-1, descending=True)
    probs = torch.softmax(logits[3, order[3]], -1)
    nucleus = order[3][(probs.cumsum(0) - probs) < 0.5]
    expected = [among(0, order[0, :4]), among(1, torch.arange(vocab), 0.7), 0.0, among(3, nucleus)]
    assert found == pytest.approx(expected, abs=1e-5)
    assert all(value < 0 for value in found[:2]) and found[2] == 0.0


@pytest.fixture(scope="module")
def reference(hf_model):
    """A prompt whose greedy continuation holds 20 distinct tokens, none of the prompt's."""
    prompt = prompts_of([8], seed=22)[0]
    tokens = hf_greedy(hf_model, prompt, 20)
    assert len(set(tokens)) == 20 and not set(tokens) & set(prompt)
    return prompt, tokens


def test_a_stop_word_ends_the_sequence_on_its_last_token_which_stays(generator, reference):
    prompt, tokens = reference
    two = tuple(tokens[5:7])
    across = (prompt[-1], tokens[0])  # matched on the prompt followed by the output, as TRT-LLM does
    cases = [((two,), tokens[:7]), (((tokens[3],), two), tokens[:4]), ((across,), tokens[:1]), (((1, 2),), tokens)]
    sinks = run_all(generator, [greedy(prompt, 20, stop_words=words) for words, _ in cases])
    assert [sink.tokens for sink in sinks] == [expected for _, expected in cases]
    streamed = run_all(generator, [greedy(prompt, 20, stop_words=(two,), streaming=True)])[0]
    assert streamed.tokens == tokens[:7]


def test_bad_words_are_never_generated(generator, reference):
    prompt, tokens = reference
    single = run_all(generator, [greedy(prompt, 20, bad_words=((tokens[1],),))])[0].tokens
    assert single[0] == tokens[0] and tokens[1] not in single and single != tokens
    pair = tuple(tokens[3:5])
    banned = run_all(generator, [greedy(prompt, 20, bad_words=(pair,))])[0].tokens
    assert banned[:4] == tokens[:4] and banned[4] != tokens[4]  # the word's last token, after the rest of it
    assert all(tuple(banned[i : i + 2]) != pair for i in range(len(banned) - 1))
    first = (prompt[-1], tokens[0])  # a word that starts in the prompt
    assert run_all(generator, [greedy(prompt, 20, bad_words=(first,))])[0].tokens[0] != tokens[0]


def test_min_tokens_holds_the_end_tokens_back(generator, reference):
    prompt, tokens = reference
    end = tokens[2]
    plain, held = run_all(
        generator,
        [GenerationRequest([prompt], 20, end_id=end), GenerationRequest([prompt], 20, end_id=end, min_tokens=6)],
    )
    assert plain.tokens == tokens[:2]
    assert held.tokens[:2] == tokens[:2] and len(held.tokens) >= 6 and end not in held.tokens


def test_min_tokens_frees_the_end_tokens_exactly_at_the_minimum(generator, reference):
    """The end token, made the model's first choice by a bias, comes as soon as it is allowed: after exactly
    ``min_tokens`` tokens, whether the loop runs one step ahead (no bad words) or in lockstep (bad words)."""
    prompt, _ = reference
    end = 7
    bias = np.zeros(end + 1, dtype=np.float32)
    bias[end] = 1.0e4

    def request(minimum, **kwargs):
        return GenerationRequest([prompt], 30, end_id=end, embedding_bias=bias, min_tokens=minimum, **kwargs)

    minimums = [1, 2, 5, 9]
    beside = greedy(prompt, 30)  # a sequence that never ends early, in the same steps
    sinks = run_all(
        generator, [beside] + [request(m) for m in minimums] + [request(m, streaming=True) for m in minimums]
    )
    assert [len(sink.tokens) for sink in sinks[1:]] == minimums * 2
    assert all(end not in sink.tokens for sink in sinks[1:])
    lockstep = run_all(generator, [request(m, bad_words=((end - 1,),)) for m in minimums])
    assert [len(sink.tokens) for sink in lockstep] == minimums


def test_bias_columns_are_where_the_bias_is_not_minus_infinity_widened_to_the_grain(monkeypatch):
    monkeypatch.setattr(sampling, "COLUMN_GRAIN", 64)
    bias = np.full(512, -np.inf, np.float32)
    bias[100:300] = 0.5
    assert sampling.bias_columns(bias, 512) == (64, 320)
    assert sampling.bias_columns(bias[:400], 512) == (64, 512)  # the columns beyond a short bias are zero
    bias[450] = np.inf  # a forced token is kept
    assert sampling.bias_columns(bias, 512) == (64, 512)
    assert sampling.bias_columns(np.zeros(512, np.float32), 512) is None
    assert sampling.bias_columns(np.full(512, -np.inf, np.float32), 512) is None


def test_a_bias_that_leaves_part_of_the_vocabulary_decodes_only_those_columns_and_chooses_the_same(
    generator, monkeypatch
):
    """Speech requests (a bias of -inf outside their tokens) sampled with every rule CosyVoice uses give the same
    tokens when the steps compute only the bias's columns as when the bias is finite everywhere (no columns), and
    the steps take the columns only while every running sequence has them."""
    monkeypatch.setattr(sampling, "COLUMN_GRAIN", 64)
    seen = []
    real_decode = generator.model.decode

    def recording(batch, span, columns):
        seen.append(columns)
        return real_decode(batch, span, columns)

    monkeypatch.setattr(generator.model, "decode", recording)
    speech = np.full(512, -np.inf, np.float32)
    speech[256:448] = np.random.default_rng(0).normal(0, 1, 192).astype(np.float32)
    other = np.full(512, -np.inf, np.float32)
    other[64:200] = 0.0
    settings = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, repetition_penalty=1.1, seed=7)

    prompts = prompts_of([5, 9, 3], seed=40)

    def requests(bias_of):
        return [
            GenerationRequest(
                [prompt], 24, end_id=300, min_tokens=5, embedding_bias=bias_of(bias), sampling=replace(settings, seed=i)
            )
            for i, (prompt, bias) in enumerate(zip(prompts, [speech, speech, other], strict=True))
        ]

    windowed = run_all(generator, requests(lambda bias: bias))
    assert (64, 448) in seen  # the union of (256, 448) and (64, 256), or one of them once the others ended
    assert set(seen) <= {(64, 448), (256, 448), (64, 256)}
    seen.clear()
    finite = run_all(generator, requests(lambda bias: np.maximum(bias, -1.0e30)))
    assert set(seen) == {None}
    assert [sink.tokens for sink in windowed] == [sink.tokens for sink in finite]
    assert all(256 <= token < 448 for sink in windowed[:2] for token in sink.tokens)
    assert all(64 <= token < 200 for token in windowed[2].tokens)
    seen.clear()
    logits = replace(requests(lambda bias: bias)[0], return_generation_logits=True)
    mixed = run_all(generator, [requests(lambda bias: bias)[1], greedy(prompts_of([4])[0], 6), logits])
    assert set(seen) == {None}  # one may choose anything, one returns its logits: all the columns
    assert mixed[0].tokens == windowed[1].tokens
    assert mixed[2].outputs[0].generation_logits.shape == (len(mixed[2].tokens), 512)


def test_penalties_run_in_the_decode_loop(generator, hf_model):
    prompt = prompts_of([8], seed=26)[0]
    plain = hf_greedy(hf_model, prompt, 20)
    assert len(set(plain)) < 20 and set(plain) & set(prompt)  # repeats itself and the prompt
    penalised = SamplingParams(top_k=1, frequency_penalty=100.0)
    tokens = run_all(generator, [greedy(prompt, 20, sampling=penalised)])[0].tokens
    assert len(set(tokens)) == 20 and not set(tokens) & set(prompt)
    present = run_all(generator, [greedy(prompt, 20, sampling=SamplingParams(top_k=1, presence_penalty=100.0))])[0]
    assert present.tokens == tokens  # seen once or many times: the same huge cut


def test_return_sequences_are_seeded_apart_and_greedy_ones_are_copies(generator, reference):
    prompt, tokens = reference
    sampled = SamplingParams(temperature=1.0, top_k=50, seed=5)
    three = run_all(generator, [greedy(prompt, 10, sampling=sampled, num_return_sequences=3)])[0].outputs
    assert [(output.row, output.index) for output in three] == [(0, 0), (0, 1), (0, 2)]
    assert len({tuple(output) for output in three}) == 3
    alone = run_all(generator, [greedy(prompt, 10, sampling=SamplingParams(1.0, 50, seed=5 + i)) for i in range(3)])
    assert [list(output) for output in three] == [sink.tokens for sink in alone]  # sequence i is seeded seed + i
    copies = run_all(generator, [greedy(prompt, 10, num_return_sequences=2)])[0].outputs
    assert [list(output) for output in copies] == [tokens[:10]] * 2 and copies[1].index == 1


def test_streaming_several_prompts_and_sequences_tags_each_piece(generator):
    prompts = prompts_of([5, 9], seed=31)
    sampled = SamplingParams(temperature=1.0, top_p=0.9, seed=8)
    offline, streamed = run_all(
        generator,
        [
            GenerationRequest(prompts, 6, end_id=NEVER_STOP, sampling=sampled, num_return_sequences=2, streaming=mode)
            for mode in (False, True)
        ],
    )
    pieces: dict[tuple[int, int], list[int]] = {}
    for piece in streamed.streamed:
        pieces.setdefault((piece.row, piece.index), []).extend(piece)
    assert pieces == {(output.row, output.index): list(output) for output in offline.outputs}
    assert len(pieces) == 4 and streamed.outputs is None


def test_log_probs_and_logits_match_transformers(generator, hf_model, reference):
    prompt, tokens = reference
    asked = {"return_log_probs": True, "return_context_logits": True, "return_generation_logits": True}
    sampled = SamplingParams(temperature=0.7, top_p=1.0, seed=3)
    output = run_all(generator, [greedy(prompt, 6, sampling=sampled, **asked)])[0].outputs[0]
    logits = hf_logits(hf_model, prompt + list(output))
    steps = logits[len(prompt) - 1 : -1]
    torch.testing.assert_close(torch.from_numpy(output.context_logits), logits[: len(prompt)], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.from_numpy(output.generation_logits), steps, atol=1e-4, rtol=1e-4)
    expected = torch.log_softmax(steps / 0.7, -1)[torch.arange(6), torch.tensor(output)]
    assert output.log_probs == pytest.approx(expected.tolist(), abs=1e-4)
    assert output.cum_log_prob == pytest.approx(sum(output.log_probs))
    pieces = run_all(generator, [greedy(prompt, 6, sampling=sampled, streaming=True, **asked)])[0].streamed
    assert [token for piece in pieces for token in piece] == list(output)
    running = np.cumsum(output.log_probs)[np.cumsum([len(piece) for piece in pieces]) - 1]
    assert [piece.cum_log_prob for piece in pieces] == pytest.approx(running.tolist())  # the sum so far
    greedy_output = run_all(generator, [greedy(prompt, 6, **asked)])[0].outputs[0]
    assert list(greedy_output) == tokens[:6] and greedy_output.log_probs == [0.0] * 6
    arrays = response_arrays(greedy(prompt, 6, **asked), greedy_output)
    assert arrays["context_logits"].shape == (1, 8, 512) and arrays["generation_logits"].shape == (1, 1, 6, 512)
    assert arrays["output_log_probs"].shape == (1, 1, 6) and arrays["cum_log_probs"].tolist() == [[0.0]]


@pytest.mark.parametrize(("given", "overlap"), [({}, False), ({"overlap_admission": "true"}, True)])
def test_the_config_parameters_set_the_engines_knobs(qwen2_dir, given, overlap):
    """config.pbtxt's parameters, as the build renders them from ``-o``: an overlap given there replaces the
    model's own default; CUDA graphs off (on the CPU they are off anyway)."""
    import json

    from trtdeploy.backend_utils import ModelParameters
    from trtdeploy.engines.torch.runtime import load_from_parameters

    values = {
        "hf_model_dir": str(qwen2_dir),
        "max_slots": "2",
        "max_input_len": "16",
        "max_seq_len": "32",
        "cuda_graphs": "false",
        **given,
    }
    config = {"name": "tensorrt_llm", "parameters": {key: {"string_value": value} for key, value in values.items()}}
    gen = load_from_parameters(ModelParameters({"model_config": json.dumps(config)}))
    try:
        assert gen.model.overlap_admission is overlap
        assert not gen.model.use_graphs
    finally:
        gen.close()
