"""bench_load's users: OpenAI-API clients that send chat completions back to back (and rate every answer), and
what a phase of them adds up to."""

import threading
import time
from pathlib import Path

from _common import pct

QUESTIONS = [
    "Count from one to twenty in words.",
    "Name some animals that live in the sea.",
    "Tell me a short story about a robot.",
    "List the planets of the solar system.",
    "Explain what a compiler does.",
    "Describe the colour blue to someone who cannot see.",
]


class Clients:
    """`n` threads that send chat completions back to back; every answer gets a feedback rating."""

    def __init__(self, run: dict, n: int, max_tokens: int, rate: bool):
        import httpx
        import openai

        self.key = Path(run["api_key_file"]).read_text().strip()
        self.endpoint, self.n, self.max_tokens, self.rate = run["endpoint"], n, max_tokens, rate
        self.model = run["model"]
        self.openai, self.httpx = openai, httpx
        self.records: list[dict] = []  # {"t", "latency", "tokens", "ok", "error", "id", "feedback"}
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def _one(self, i: int) -> None:
        c = self.openai.OpenAI(base_url=self.endpoint, api_key=self.key, max_retries=0, timeout=300)
        k = 0
        while not self.stop.is_set():
            q = QUESTIONS[(i + k) % len(QUESTIONS)]
            k += 1
            t0 = time.monotonic()
            rec = {"t": t0, "ok": False, "tokens": 0, "id": None, "feedback": None, "error": None}
            try:
                r = c.chat.completions.create(
                    model=self.model, messages=[{"role": "user", "content": q}], max_tokens=self.max_tokens
                )
                rec.update(ok=True, tokens=r.usage.completion_tokens, id=r.id)
            except Exception as exc:  # noqa: BLE001 - a failed request is what this measures
                rec["error"] = repr(exc)[:200]
            rec["latency"] = time.monotonic() - t0
            if rec["ok"] and self.rate:
                try:
                    fb = self.httpx.post(
                        self.endpoint + "/feedback",
                        headers={"Authorization": f"Bearer {self.key}"},
                        json={"interaction_id": rec["id"], "score": 1.0 if k % 2 else -1.0},
                        timeout=60,
                    )
                    rec["feedback"] = fb.status_code
                except Exception as exc:  # noqa: BLE001
                    rec["feedback"] = repr(exc)[:100]
            with self.lock:
                self.records.append(rec)

    def run_for(self, seconds: float) -> list[dict]:
        self.stop.clear()
        start = len(self.records)
        threads = [threading.Thread(target=self._one, args=(i,), daemon=True) for i in range(self.n)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(seconds)
        self.stop.set()
        for t in threads:
            t.join(600)
        self.wall = time.monotonic() - t0
        return self.records[start:]


def summary(recs: list[dict], wall: float) -> dict:
    ok = [r for r in recs if r["ok"]]
    lat = [r["latency"] for r in ok]
    return {
        "requests": len(recs),
        "failed": len(recs) - len(ok),
        "tokens_per_s": round(sum(r["tokens"] for r in ok) / wall, 2),
        "p50_s": round(pct(lat, 0.5), 2) if lat else None,
        "p99_s": round(pct(lat, 0.99), 2) if lat else None,
        "errors": sorted({r["error"] for r in recs if r["error"]})[:5],
    }
