"""Structured logs and traces, set up once per process.

structlog writes key-value lines with bound context (actor, event_id, kind, weights_version) and
the current OTel trace id. Spans go to an in-process exporter by default (kept for tests and
`status`), or to OTLP/HTTP when `telemetry.otlp_endpoint` is configured. Trace context rides in
NATS headers (W3C `traceparent`) so one trace follows an interaction to the weights it changed.
"""

from __future__ import annotations

import logging
import sys

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_MEMORY = InMemorySpanExporter()
_configured = False


def _add_trace(_, __, event_dict):
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict["trace_id"] = format(ctx.trace_id, "032x")
    return event_dict


def setup(service: str, level: str = "info", otlp_endpoint: str | None = None, stream=None) -> None:
    """Configure structlog and the tracer provider for this process (idempotent)."""
    global _configured
    if _configured:
        return
    _configured = True
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_trace,
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"], drop_missing=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=True,
    )
    provider = TracerProvider(resource=Resource.create({"service.name": f"kaizen.{service}"}))
    provider.add_span_processor(SimpleSpanProcessor(_MEMORY))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    trace.set_tracer_provider(provider)


def memory_spans() -> InMemorySpanExporter:
    return _MEMORY


def tracer(name: str = "kaizen") -> trace.Tracer:
    return trace.get_tracer(name)


def log(**bound) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger().bind(**bound)


def inject_headers(headers: dict[str, str]) -> dict[str, str]:
    """Write the current trace context into NATS headers."""
    inject(headers)
    return headers


def context_from_headers(headers: dict[str, str] | None) -> otel_context.Context:
    return extract(headers or {})


def current_trace_id() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None
