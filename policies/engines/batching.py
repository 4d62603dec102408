"""Serving batches: concurrent single-prompt calls of a replica's transformers engine answered together."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from policies.engines.generation import Generation


@dataclass
class Request:
    prompt: str
    max_new_tokens: int
    temperature: float
    top_p: float
    stream_cb: object = None
    stops: tuple[str, ...] = ()  # the request's stop strings: its row ends at the first (`RowStops`)
    matcher: object = None  # its response_format grammar's matcher (`policies.grammar`), None: free text
    result: Generation | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def key(self) -> tuple:
        return (round(self.temperature, 6), round(self.top_p, 6)) if self.temperature > 0 else (0.0, 1.0)


class Batcher:
    """Batches concurrent single-prompt calls: callers block in `submit`; one worker thread takes the oldest
    request and every waiting one with the same sampling parameters (up to `max_batch`), waits up to
    `window_s` for more while the batch is not full, runs them as one padded batch (`run`) and hands each
    caller its row. Requests that arrive while a batch runs form the next one, so under load batches fill
    by themselves and a lone request waits at most `window_s`."""

    def __init__(self, run, max_batch: int = 8, window_s: float = 0.01):
        self.run, self.max_batch, self.window_s = run, max_batch, window_s
        self.queue: list[Request] = []
        self.cv = threading.Condition()
        self.batches = self.requests = 0
        threading.Thread(target=self._loop, name="engine-batcher", daemon=True).start()

    def submit(
        self,
        prompt: str,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stream_cb=None,
        stops=(),
        matcher=None,
    ) -> Generation:
        r = Request(prompt, max_new_tokens, float(temperature or 0.0), float(top_p), stream_cb, tuple(stops), matcher)
        with self.cv:
            self.queue.append(r)
            self.cv.notify_all()
        r.done.wait()
        if r.error is not None:
            raise r.error
        return r.result

    def _take(self) -> list[Request]:
        with self.cv:
            self.cv.wait_for(lambda: self.queue)
            key = self.queue[0].key()
            deadline = time.monotonic() + self.window_s
            while sum(r.key() == key for r in self.queue) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                self.cv.wait(left)
            batch = [r for r in self.queue if r.key() == key][: self.max_batch]
            self.queue = [r for r in self.queue if all(r is not b for b in batch)]
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            try:
                for r, g in zip(batch, self.run(batch), strict=True):
                    r.result = g
            except BaseException as exc:  # every caller of the batch gets the error
                for r in batch:
                    r.error = exc
            self.batches += 1
            self.requests += len(batch)
            for r in batch:
                r.done.set()


class RowBudget:
    """Stopping criterion: a row is done once it generated its own token budget (rows of a batch differ)."""

    def __init__(self, torch, n_prompt: int, max_new: list[int], device):
        self.n_prompt, self.limit = n_prompt, torch.tensor(max_new, device=device)

    def __call__(self, input_ids, scores, **kw):
        return (input_ids.shape[1] - self.n_prompt) >= self.limit


class RowStops:
    """Stopping criterion: a row is done once its new text holds one of its own stop strings (a request's `stop`:
    the answer is cut there anyway, so generating on would only cost time and count tokens nobody gets)."""

    def __init__(self, torch, tok, n_prompt: int, stops: list[tuple[str, ...]]):
        self.torch, self.tok, self.n_prompt, self.stops = torch, tok, n_prompt, stops
        self.done = [False] * len(stops)
        self.tail = max((len(s) for row in stops for s in row), default=0) + 4  # tokens: each is a character or more

    def __call__(self, input_ids, scores, **kw):
        for i, row in enumerate(self.stops):
            if row and not self.done[i]:  # only the new tail can complete a stop string: the rest was checked before
                tail = input_ids[i, max(self.n_prompt, input_ids.shape[1] - self.tail) :].tolist()
                self.done[i] = any(s in self.tok.decode(tail, skip_special_tokens=True) for s in row)
        return self.torch.tensor(self.done, dtype=self.torch.bool, device=input_ids.device)


class RowStreamer:
    """Streamer for a batch: decodes each row incrementally and hands its new text to that row's callback
    (None = not streamed), until the row's end token or budget."""

    def __init__(self, tok, cbs: list, max_new: list[int], stops: tuple):
        self.tok, self.cbs, self.max_new, self.stops = tok, cbs, max_new, stops
        self.ids: list[list[int]] = [[] for _ in cbs]
        self.sent, self.done, self.first = [""] * len(cbs), [cb is None for cb in cbs], True

    def put(self, value):
        if self.first:  # the prompt comes first
            self.first = False
            return
        for i, t in enumerate(value.reshape(len(self.cbs), -1)[:, -1].tolist()):
            if self.done[i]:
                continue
            if t in self.stops:
                self.done[i] = True
                continue
            self.ids[i].append(t)
            self.done[i] = len(self.ids[i]) >= self.max_new[i]
            text = self.tok.decode(self.ids[i], skip_special_tokens=True)
            if len(text) > len(self.sent[i]) and not text.endswith("\ufffd"):
                self.cbs[i](text[len(self.sent[i]) :])
                self.sent[i] = text

    def end(self):
        pass
