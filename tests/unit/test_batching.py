"""Serving batches: concurrent single-prompt calls share one padded batch, each with its own budget and
stream, and the tokenizer is safe to share between threads."""

import threading

from policies.engines.batching import Batcher
from policies.engines.generation import Generation


def _calls(batcher, specs):
    out, threads = [None] * len(specs), []
    for i, (prompt, n, temp) in enumerate(specs):

        def go(i=i, prompt=prompt, n=n, temp=temp):
            try:
                out[i] = batcher.submit(prompt, n, temp)
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                out[i] = exc

        threads.append(threading.Thread(target=go))
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_batcher_groups_waiting_requests_by_sampling_parameters():
    seen = []
    gate = threading.Event()

    def run(reqs):
        seen.append([(r.prompt, r.temperature) for r in reqs])
        gate.wait(5)
        return [Generation(r.prompt.upper(), 1, r.max_new_tokens, "length") for r in reqs]

    b = Batcher(run, max_batch=3, window_s=1.0)
    threading.Timer(0.5, gate.set).start()
    out = _calls(b, [("a", 4, 0.0), ("b", 5, 0.0), ("c", 6, 0.7), ("d", 7, 0.0), ("e", 8, 0.0)])
    assert [g.text for g in out] == ["A", "B", "C", "D", "E"]
    assert [g.completion_tokens for g in out] == [4, 5, 6, 7, 8]  # every caller gets its own row
    greedy = [p for batch in seen for p, t in batch if t == 0.0]
    assert sorted(greedy) == ["a", "b", "d", "e"]
    assert all(len({t for _, t in batch}) == 1 for batch in seen)  # one sampling setting per batch
    assert max(len(batch) for batch in seen) == 3 and len(seen) <= 3
    assert b.requests == 5


def test_batcher_hands_an_error_to_every_caller_of_the_batch():
    def run(reqs):
        raise RuntimeError("boom")

    b = Batcher(run, max_batch=4, window_s=0.1)
    out = _calls(b, [("a", 1, 0.0), ("b", 1, 0.0)])
    assert all(isinstance(x, RuntimeError) and "boom" in str(x) for x in out)
    assert _calls(b, [("c", 1, 0.0)])[0].args == ("boom",)  # and it keeps serving


def test_engine_batches_concurrent_calls_with_their_own_budgets_and_streams(model_dir):
    from actors.events import ChatMessage
    from policies.chat import render
    from policies.engines.engine import TransformersEngine

    eng = TransformersEngine(model_dir, max_batch=4, batch_window_ms=5000)  # full at 4: no wait
    prompts = [
        render([ChatMessage(role="user", content=q)])
        for q in ("Tell me about Paris.", "Write a long poem about the sea.", "Count from 1 to 50.", "Hi")
    ]
    budgets = [3, 9, 17, 24]
    streamed = [[] for _ in prompts]
    out, threads = [None] * 4, []
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        threads.append(
            threading.Thread(
                target=lambda i=i, p=p, n=n: out.__setitem__(i, eng.generate([p], n, stream_cb=streamed[i].append)[0])
            )
        )
    errors = []

    def count():  # another thread tokenises while the batch runs ("Already borrowed" before the lock)
        try:
            for _ in range(300):
                eng.count_tokens("a\u00e9b " * 200)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads.append(threading.Thread(target=count))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors
    assert eng.batcher.batches == 1 and eng.batcher.requests == 4
    for g, n, pieces in zip(out, budgets, streamed):
        assert 0 < g.completion_tokens <= n and (g.finish_reason == "length") == (g.completion_tokens == n)
        assert "".join(pieces).strip() == g.text.strip()
    assert eng.generate([], 9) == []  # an empty batch: no answers (its tokenizer would fail on it)
    alone = eng.generate([prompts[1]], 9)[0]  # the same prompt alone: same greedy answer as in the batch
    assert alone.completion_tokens == out[1].completion_tokens
