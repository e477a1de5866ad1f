"""The torch engine's runtime on the CPU, without Triton: exactness against transformers, sampling, batching, errors."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from trtdeploy.engines.torch.runtime import (  # noqa: E402
    NEVER_STOP,
    DecoderModel,
    GenerationRequest,
    Generator,
    GeneratorConfig,
    SamplingParams,
    SamplingPlan,
    SlotSampler,
    load_generator,
    output_arrays,
    special_tokens,
    uniform_noise,
)

from .torch_helpers import RecordingSink, write_tiny_model  # noqa: E402

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
    captures = []

    def capture(forward):  # what the model's CUDA graph capture promises: replay() recomputes into one output
        output = forward()
        captures.append(forward)

        class Replay:
            def replay(self):
                output.copy_(forward())

        return Replay(), output

    cpu = torch.device("cpu")
    reference, decoding = SlotSampler(4, vocab, cpu), SlotSampler(4, vocab, cpu, capture)
    for sampler in (reference, decoding):
        sampler.assign([0, 1, 2, 3], params, [[1, 2]] * 4)
    for _ in range(3):
        expected = reference.sample(logits, [0, 1, 2, 3], counters)
        assert decoding.sample_decode(logits, counters).tolist() == expected.tolist()
        counters += 1  # in place, like the model's positions buffer the graph reads
    assert len(captures) == 1
    assert torch.equal(reference.seen, decoding.seen)  # the penalty's record of seen tokens is kept alike
    assert SamplingPlan.of(params, vocab) == SamplingPlan(penalised=True, draws=True, width=64, nucleus=True)
    decoding.release(3)
    decoding.sample_decode(logits, counters)
    assert len(captures) == 2  # a new plan (no penalty any more) is a new capture


def test_uniform_noise_is_a_pure_function_and_well_spread():
    ids = torch.arange(20000).expand(2, -1)
    first = uniform_noise(torch.tensor([5, 5]), torch.tensor([0, 1]), ids)
    again = uniform_noise(torch.tensor([5]), torch.tensor([1]), ids[:1])
    assert torch.equal(first[1], again[0])
    assert not torch.equal(first[0], first[1])
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


def test_a_sender_that_falls_behind_merges_each_streams_tokens():
    """Events queued while responses went out: one send per stream, its tokens in order, finals after them."""
    from trtdeploy.engines.torch.runtime.generator import coalesce_tokens

    class Sink:
        def __init__(self):
            self.calls = []

        def send_tokens(self, tokens):
            self.calls.append(("tokens", tokens))

        def send_final(self, outputs):
            self.calls.append(("final", outputs))

    a, b = Sink(), Sink()
    events = [
        (a.send_tokens, ([1],), False), (b.send_tokens, ([7],), True), (a.send_tokens, ([2],), True),
        (b.send_tokens, ([8],), True), (a.send_tokens, ([3],), True), (a.send_final, (None,), False),
        (b.send_tokens, ([9],), True),
    ]  # fmt: skip
    for send, args, _ in coalesce_tokens(events):
        send(*args)
    assert a.calls == [("tokens", [1]), ("tokens", [2, 3]), ("final", None)]  # a's first token went out alone
    assert b.calls == [("tokens", [7, 8, 9])]
    assert events[1][1] == ([7],)  # the queued events themselves are left as they were


def test_a_request_with_several_prompts_and_the_input_included(generator, hf_model):
    prompts = prompts_of([4, 9], seed=10)
    sink = run_all(generator, [GenerationRequest(prompts, 5, end_id=NEVER_STOP, exclude_input=False)])[0]
    assert sink.outputs == [prompt + hf_greedy(hf_model, prompt, 5) for prompt in prompts]
    ids, lengths = output_arrays(sink.outputs, pad_id=7)
    assert ids.shape == (2, 1, 14) and lengths.tolist() == [[9], [14]]
    assert ids[0, 0, 9:].tolist() == [7] * 5


# --- (e) continuous batching -----------------------------------------------------------------------------------


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
        (GenerationRequest([[5], [6]], 4, streaming=True), "one sequence per request"),
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

    def flaky(batch, span):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real_decode(batch, span)

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
