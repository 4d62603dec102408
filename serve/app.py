"""The Ray Serve app: an OpenAI-compatible endpoint that records every interaction.

Routes (DESIGN.md "HTTP"): POST /v1/chat/completions (tools, stream), GET /v1/models,
POST /v1/feedback, GET /healthz, GET /readyz, GET /metrics (Prometheus, `serve/metrics.py`), and the live page of the
evolution: GET /page, /page/state, /page/events (`serve/page.py`). Every /v1 route needs `Authorization: Bearer <key>`,
the deployment's key or a per-user one (`serve.user_keys_file`); /metrics and the page's data the deployment's alone.
Bodies are size-checked and validated before the model runs; bad input is a 4xx with a message.

Each replica retrieves experiences from the navigator for the live request (the fast loop) and
writes `evo.interaction.<id>` (and `evo.feedback`) through a durable outbox, its one store of interactions;
feedback finds them there or on the stream (`serve/feedback.py`). Its weights follow the LIVE
pointer (`serve/weights.py`); every interaction records the version that answered it. The OpenAI
wire format is `serve/wire.py`, the network edge (auth, body checks, loopback) `serve/net.py`.
"""

import asyncio
import functools
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve

from actors import events
from actors.bus import Bus
from actors.events import ChatMessage, RetrieveReply, RetrieveRequest, WeightsSwapped
from config import telemetry
from config.settings import Settings
from policies.chat import CALL_PREFIX, call_opening, render
from policies.engines.live_policy import LivePolicy
from serve.feedback import take_feedback
from serve.interactions import Turn, user_salt
from serve.metrics import CONTENT_TYPE, Metrics
from serve.net import Keys, authorized, load_user_keys, loopback_replica_grpc, read_body, unauthorized
from serve.outbox import Outbox
from serve.page import Page
from serve.page import router as page_router
from serve.streaming import sse_response
from serve.weights import ReplicaWeights
from serve.wire import BadRequest, answer_errors, completion, model_card, no_such_model, parse_chat, too_long

app = FastAPI(title="Kaizen", docs_url=None, redoc_url=None, openapi_url=None)
app.include_router(page_router)  # the page's shell: public, it holds no data
answer_errors(app)


@serve.deployment(max_ongoing_requests=8, health_check_period_s=10, graceful_shutdown_timeout_s=20)
@serve.ingress(app)
class KaizenServer:
    def __init__(self, settings_json: str, api_key: str, salt: str, user_keys: dict[str, str] | None = None):
        loopback_replica_grpc()
        self.s = Settings.model_validate_json(settings_json)
        if self.s.telemetry.strict_events:
            events.strict()
        (self.s.state / "logs").mkdir(parents=True, exist_ok=True)
        telemetry.setup(
            "serve",
            self.s.telemetry.log_level,
            self.s.telemetry.otlp_endpoint,
            stream=open(self.s.state / "logs" / "serve.log", "a", buffering=1),
        )
        self.key, self.keys = api_key, Keys(api_key, user_keys)  # user_keys: {key: name}, `serve.user_keys_file`
        self.salt = bytes.fromhex(salt)  # `user_salt`: the deployment's, the same on every host
        try:
            self.replica = serve.get_replica_context().replica_tag
        except Exception:
            self.replica = f"{socket.gethostname()}-{os.getpid()}"
        self.log = telemetry.log(actor="serve", replica=self.replica)
        self.tracer = telemetry.tracer("kaizen.serve")
        self.page = Page(api_key, self.s.nats.subject_prefix, self.log)
        self._pool = ThreadPoolExecutor(self.s.serve.max_ongoing_requests + 2, thread_name_prefix="generate")
        self.bus: Bus | None = None
        self._watcher: asyncio.Task | None = None
        self.outbox = Outbox(self.s.state / "serve" / "outbox.db")
        self._drainer: asyncio.Task | None = None
        self._bus_lock = asyncio.Lock()
        self.served, self.metrics = 0, Metrics(self.outbox.size)
        self.weights = ReplicaWeights(
            LivePolicy(self.s, "serve", log=self.log), self.replica, self.s.nats.subject_prefix, self._report, self.log
        )  # the live version (and canary) before traffic

    # ------------------------------------------------------------------ plumbing

    async def _in_pool(self, fn, *args):
        """Generation blocks a thread until its batch is done: every request in flight has its own thread
        (asyncio's default pool has cpu_count + 4, fewer than the requests one batch takes)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    async def _ensure_bus(self) -> Bus:
        """The bus connection (it reconnects by itself after an outage); the first connect is bounded, so a
        bus that is down costs a request at most a few seconds once, then nothing (see `_retrieve`)."""
        if self._drainer is None:
            self._drainer = asyncio.create_task(self.outbox.run(self._ensure_bus, self.log))
        async with self._bus_lock:
            if self.bus is None:
                bus = Bus.from_settings(self.s.nats, f"serve:{self.replica}")
                self.bus = await asyncio.wait_for(bus.connect(ensure_stream=False), 3.0)
                self._watcher = asyncio.create_task(self.weights.watch(self.bus.nc))
                await self.metrics.follow(self.bus.nc, self.s.nats.subject_prefix, self.log)
        return self.bus

    async def check_health(self) -> None:
        """Unhealthy (Ray restarts the replica) only for what a restart fixes; a bus outage is not that."""
        try:
            await self._ensure_bus()
        except Exception as exc:
            self.log.warning("bus.unreachable", error=repr(exc)[:200])
        if self._watcher is not None and self._watcher.done() and self._watcher.exception():
            raise RuntimeError(f"weight watcher died: {self._watcher.exception()!r}")
        if self._drainer is not None and self._drainer.done():
            raise RuntimeError(f"outbox drainer died: {self._drainer.exception()!r}")

    async def _report(self, ev: WeightsSwapped) -> None:
        if ev.reason != "joined":
            self.metrics.swapped(ev.swap_ms / 1000)
        await asyncio.to_thread(self.outbox.put, ev, telemetry.inject_headers({}))

    @property
    def engine(self):
        return self.weights.engine

    async def _body(self, request: Request):
        return await read_body(request, self.keys, self.s.serve.max_body_bytes)

    async def _retrieve(self, query: str) -> RetrieveReply:
        if self.bus is not None and not self.bus.connected:  # down: answer without memory, at once
            return RetrieveReply()
        try:
            bus = await self._ensure_bus()
            return await bus.request(
                "retrieve",
                RetrieveRequest(query=query[:2000], k=self.s.serve.experiences_k, origin="serve"),
                RetrieveReply,
                timeout=self.s.serve.retrieve_timeout_s,
            )
        except Exception:
            return RetrieveReply()

    # ------------------------------------------------------------------ routes

    @app.get("/healthz")
    async def healthz(self):
        return {"status": "ok", "replica": self.replica}

    @app.get("/readyz")
    async def readyz(self):
        """Ready = takes chat traffic (the model is loaded). The bus is reported, not required: while it is
        down chat answers and interactions and feedback wait in the outbox ("bus": "down", "outbox": n)."""
        try:
            await self._ensure_bus()
        except Exception:
            pass
        bus = "connected" if self.bus is not None and self.bus.connected else "down"
        return {
            "status": "ready" if bus == "connected" else "degraded",
            "bus": bus,
            "outbox": await asyncio.to_thread(self.outbox.size),
            "weights_version": self.engine.version,
            "replica": self.replica,
            "canary": self.weights.canary_version,
            "canary_share": self.weights.engines.share,
        }

    def _model_names(self) -> list[str]:
        return [self.s.model.name, *self.s.serve.model_aliases]

    def _model(self, name: str) -> dict:
        return model_card(name, self.engine.version, self.replica, self.weights.canary_version)

    @app.get("/v1/models")
    async def models(self, request: Request):
        if self.keys.holder(request) is None:
            return unauthorized()
        return {"object": "list", "data": [self._model(n) for n in self._model_names()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(self, model_id: str, request: Request):
        if self.keys.holder(request) is None:
            return unauthorized()
        return self._model(model_id) if model_id in self._model_names() else no_such_model(model_id, self.s.model.name)

    @app.get("/metrics")
    async def prometheus(self, request: Request):
        if not authorized(request, self.key):
            return unauthorized()
        return Response(await asyncio.to_thread(self.metrics.render), media_type=CONTENT_TYPE)

    @app.get("/page/state")
    async def page_state(self, request: Request):
        return await self.page.state(request, self._ensure_bus)

    @app.get("/page/events")
    async def page_events(self, request: Request):
        return await self.page.events(request, self._ensure_bus)

    @app.post("/v1/feedback")
    async def feedback(self, request: Request):
        body, err = await self._body(request)
        if err:
            return err
        return await take_feedback(body, self.outbox, self._ensure_bus, self.tracer, self.log)

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request):
        body, err = await self._body(request)
        if err:
            return err
        try:
            req, messages, tools, forced = parse_chat(body, self.s.serve.max_new_tokens, checked=True)  # _body checked it
        except BadRequest as exc:
            return exc.response()
        if req.model and req.model not in self._model_names():
            return no_such_model(req.model, self.s.model.name)
        query = next((m.content for m in reversed(messages) if m.role == "user"), "")
        iid = f"chatcmpl-{uuid.uuid4().hex}"
        engine = self.weights.engines.pick(iid)  # this request is answered by one engine from start to end
        with self.tracer.start_as_current_span("serve.chat") as span:
            mem = await self._retrieve(query) if req.memory else RetrieveReply()
            exps = [e.text for e in mem.experiences]
            prompt = render(messages, tools, exps)
            if forced == CALL_PREFIX:  # required: one of the declared names, chosen only from a prompt that fits
                n_head = await asyncio.to_thread(engine.count_tokens, prompt + CALL_PREFIX)
                if err := too_long(n_head, self.s.serve.max_prompt_tokens):
                    return err
                name = await asyncio.to_thread(
                    engine.choose, prompt + CALL_PREFIX, [t.function.name + '"' for t in tools], req.temperature
                )
                forced = call_opening(next(t for t in tools if t.function.name + '"' == name), grammar=True)
            prompt += forced
            n_prompt = await asyncio.to_thread(engine.count_tokens, prompt)
            if err := too_long(n_prompt, self.s.serve.max_prompt_tokens):
                return err
            max_new = req.max_completion_tokens or req.max_tokens or self.s.serve.max_new_tokens
            span.set_attribute("kaizen.interaction_id", iid)
            trace_id = telemetry.current_trace_id()
            trace_headers = telemetry.inject_headers({})
            turn = Turn(
                req=req,
                messages=messages,
                tools=tools,
                memory=mem,
                prompt=prompt,
                forced=forced,
                max_new=max_new,
                iid=iid,
                trace_id=trace_id,
                trace_headers=trace_headers,
                engine=engine,
                n_prompt=n_prompt,
                peer=request.client.host if request.client else "",
                holder=self.keys.holder(request) or "",
            )
            if req.stream:
                return sse_response(self, turn)  # server-sent events, unbuffered by proxies
            gen = (await self._in_pool(turn.generate))[0]
            version = gen.version or engine.version
            answer = turn.answer(gen)
            await self._record(turn, answer, version, gen.straddled)
            return completion(iid, self.s.model.name, version, answer, gen, n_prompt, turn.finish(answer, gen))

    async def _record(self, turn: Turn, answer: ChatMessage, version: str, straddled: bool = False) -> None:
        ev = turn.interaction(answer, version, straddled, self.replica, self.key, self.salt)
        self.served += 1
        self.metrics.answered(bool(turn.req.stream), time.perf_counter() - turn.t0, turn.n_completion)
        try:
            await asyncio.to_thread(self.outbox.put, ev, turn.trace_headers)  # published by the drainer
        except Exception:  # the user got the answer; feedback on it will find nothing
            self.log.exception("interaction.not_queued", interaction_id=turn.iid)


def build_app(settings: Settings, api_key: str):
    s = settings.serve
    spread = {"max_replicas_per_node": s.max_replicas_per_node} if s.max_replicas_per_node else {}
    return KaizenServer.options(
        num_replicas=s.replicas,
        max_ongoing_requests=s.max_ongoing_requests,
        ray_actor_options={"num_cpus": s.replica_cpus, "num_gpus": s.replica_gpus},
        **spread,
    ).bind(settings.model_dump_json(), api_key, user_salt(settings.state).hex(), load_user_keys(s.user_keys_file, api_key))


def app_builder(args: dict):
    """Serve application builder for `serve run` / KubeRay: args {config, api_key_file, nats_url, state_dir}."""
    from config.settings import load_settings

    s = load_settings(args.get("config"))
    if args.get("state_dir"):
        s.state_dir = args["state_dir"]
    if args.get("nats_url"):
        s.nats.url = args["nats_url"]
    if args.get("nats_password_file"):
        s.nats.password = open(args["nats_password_file"]).read().strip()
    key = open(args["api_key_file"]).read().strip() if args.get("api_key_file") else s.serve.api_key
    if not key:
        raise ValueError("app_builder needs api_key_file (or serve.api_key in the config)")
    return build_app(s, key)
