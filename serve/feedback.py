"""POST /v1/feedback: find the rated interaction, then queue a `Feedback` event that names it.

Serve has one store for interactions, the outbox (`serve/outbox.py`): it holds each one until JetStream acked its
publish, and from then on the stream is the store. So a rating looks its interaction up
1. in this node's outbox, where it is while still pending (the bus may be down: feedback works then too), then
2. on the stream, by id (`Bus.interaction`: one subject per interaction, answered from JetStream's subject index
   by get-last-message-by-subject). Any replica finds what any other served, on any node, with an empty state dir.
The outbox publishes in order and forgets a row only after the ack, so between the two steps an interaction is
always in one of them.

Unknown id -> 404. When the bus cannot answer (down, or no answer within LOOKUP_TIMEOUT_S) and the id is not
pending here -> 503 with Retry-After: the interaction may exist, so it is not called unknown.

The Feedback event names the interaction and carries no copy of it: its readers look it up the same way.
Identical feedback has an identical event id: the outbox keeps it once, JetStream drops a repeated publish
(`Nats-Msg-Id`), and handlers skip ids they applied.
"""

from __future__ import annotations

import asyncio

import nats.errors
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from actors.events import Feedback, Interaction, derived_id
from config import telemetry
from serve.interactions import interaction_event_id
from serve.outbox import Outbox
from serve.schemas import FeedbackRequest
from serve.wire import error, first_param, pretty

LOOKUP_TIMEOUT_S = 5.0  # a first connect (serve bounds it at 3 s) and one lookup; past it the bus is unreachable


class Unreachable(Exception):
    """The bus could not say whether an interaction exists."""


async def find_interaction(
    outbox: Outbox, ensure_bus, interaction_id: str, timeout_s: float = LOOKUP_TIMEOUT_S
) -> Interaction | None:
    """The interaction pending in `outbox`, else stored on the stream; None when neither has it. `ensure_bus`
    returns the connected `Bus`. Raises Unreachable when the bus cannot answer within `timeout_s`."""
    pending = await asyncio.to_thread(outbox.get, interaction_event_id(interaction_id))
    if isinstance(pending, Interaction):
        return pending
    try:
        async with asyncio.timeout(timeout_s):
            bus = await ensure_bus()
            if not bus.connected:  # reconnecting: a request would only wait for the timeout
                raise Unreachable("the event bus is disconnected")
            return await bus.interaction(interaction_id, timeout=timeout_s)
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        raise Unreachable(f"the event bus did not answer: {exc!r}"[:200]) from exc


def unavailable(message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message[:400], "type": "unavailable", "code": 503}}, status_code=503, headers={"Retry-After": "5"}
    )


async def take_feedback(body, outbox: Outbox, ensure_bus, tracer, log) -> JSONResponse:
    """202 with the Feedback's event id once it is in the outbox; 400 / 404 / 503 as the module docstring says."""
    try:
        fb = FeedbackRequest.model_validate(body)
    except ValidationError as exc:
        return error(400, pretty(exc), param=first_param(exc))
    try:
        it = await find_interaction(outbox, ensure_bus, fb.interaction_id)
    except Unreachable as exc:
        log.warning("feedback.bus_unreachable", interaction_id=fb.interaction_id, error=str(exc))
        return unavailable(
            f"interaction {fb.interaction_id!r} is not pending on this replica and the event bus is "
            f"unreachable, so it cannot be looked up now; retry later ({exc})"
        )
    if it is None:
        return error(
            404,
            f"unknown interaction_id {fb.interaction_id!r}: this deployment served no interaction with "
            "this id (or the stream no longer keeps it)",
            "not_found_error",
        )
    event_id = derived_id("feedback", f"{fb.interaction_id}|{fb.score}|{fb.comment}")
    ev = Feedback(event_id=event_id, interaction_id=fb.interaction_id, score=fb.score, comment=fb.comment, trace_id=it.trace_id)
    ev.weights_version = it.weights_version
    # the feedback joins the trace of the request it rates
    with tracer.start_as_current_span("serve.feedback", context=telemetry.context_from_headers(it.trace_context)):
        headers = telemetry.inject_headers({})
    try:
        await asyncio.to_thread(outbox.put, ev, headers)
    except Exception as exc:  # the local disk failed: the client should retry
        log.exception("feedback.not_kept", interaction_id=fb.interaction_id)
        return unavailable(f"feedback could not be stored: {exc!r}")
    return JSONResponse({"status": "accepted", "event_id": event_id}, status_code=202)
