"""Structured output: a request's `response_format` as a grammar every engine enforces token by token (llguidance,
the library behind vLLM's `guidance` structured-output backend).

`response_grammar` turns `{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"schema": ...}}` into
one Lark grammar text (`%json` embeds the schema), the form both engines take: vLLM as its structured-output
grammar, the transformers engine through `GrammarRows`, a logits processor that masks each constrained row of a
padded batch by its own matcher. With tools a client may still call (`tool_choice` auto), the grammar also admits
a call in this policy's markup, `<tool_call>[{"name": <declared>, "arguments": {...}}]</tool_call>`: the answer is
JSON or a call, as the reference's is, each strict function's call with its own parameters. Without a
`response_format`, a `strict` function (OpenAI's strict function calling, the Agents SDK's default) asks for a grammar
too: free text, then perhaps a call block, its strict calls with their own parameters. A forced call needs no
grammar (its answer is a call), unless its function is `strict` (OpenAI's strict function calling): then its
arguments are decoded under their schema (`strict_arguments_grammar`). Where a vocabulary writes the call markup as
one token each (`has_call_tokens`: Qwen2.5's and Qwen3's `<tool_call>`, `</tool_call>`), the grammar admits those tokens
too: llguidance reads every added token as a special one, which no grammar text matches."""

from __future__ import annotations

import functools
import json
import threading

from actors.events import ToolSpec
from policies.chat import CALL_OPEN, call_opening

CALL_CLOSE = "</tool_call>"

MAX_SCHEMA_CHARS = 32_000
SPACING = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def response_grammar(
    response_format: dict | None,
    tools: list[ToolSpec] = (),
    forced: str | bool = False,
    one_call: bool = False,
    call_tokens: bool = False,
) -> str | None:
    """The Lark grammar a request's `response_format` asks for, None for text; `one_call`: at most one call
    (`parallel_tool_calls: false`). A `forced` call (its opening, `<tool_call>[{"name": "f", "arguments": `) is a call:
    its grammar is its arguments' schema when f is `strict`, else none. `call_tokens`: the engine's vocabulary has the
    call markup as tokens of its own (`has_call_tokens`). ValueError names what is wrong: an unknown type, a json_schema
    without a schema object, a schema the compiler refuses."""
    kind = (response_format or {}).get("type", "text")
    if forced:
        spec = next((t.function for t in tools if forced == call_opening(t, grammar=True)), None)
        return strict_arguments_grammar(spec, call_tokens) if spec is not None and spec.strict else None
    if kind == "text":
        return _prose_or_calls(tools, one_call, call_tokens) if any(t.function.strict for t in tools) else None
    if kind == "json_object":
        schema = {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name", ""), str):
            raise ValueError("response_format json_schema needs a json_schema object: {name, schema, strict}")
        schema = spec.get("schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise ValueError("response_format json_schema.schema must be a JSON Schema object")
    else:
        raise ValueError(f"response_format type {kind!r} is not supported; use text, json_object or json_schema")
    # JSON as json.dumps writes it (the spacing the model reads in its prompts), and no run of whitespace to spend the
    # token budget on; a schema's own "x-guidance" options win
    own = schema.get("x-guidance")
    text = json.dumps({**schema, "x-guidance": {**SPACING, **(own if isinstance(own, dict) else {})}})
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValueError(f"response_format schema is {len(text)} characters; at most {MAX_SCHEMA_CHARS}")
    lark = f"start: answer\nanswer: %json {text}\n"
    if tools:
        calls = _calls(tools, one_call)
        lark = f"start: answer | call\nanswer: %json {text}\ncall: {_open(call_tokens)} %json {calls} {_close(call_tokens)}\n"
    return _checked(lark, "response_format schema")


def _prose_or_calls(tools: list[ToolSpec], one_call: bool, call_tokens: bool = False) -> str:
    """Text, as free as without a grammar, or text that opens one call block whose calls name declared functions,
    each strict one's arguments matching its parameters: OpenAI's strict function calling while the model may still
    answer in words (`tool_choice` auto). The text before a call is one lexeme with its opening, as the lexer takes
    the longest match and would not give back a `<tool_call` it had read as text; the opening's own token (a special
    one to llguidance) ends the text before it."""
    token = f" | prose {CALL_OPEN} calls {_close(True)}" if call_tokens else ""
    return _checked(
        f"start: prose | OPEN calls {_close(call_tokens)}{token}\nprose: PROSE?\n"
        "PROSE: /(?s:.+)/ & ~/(?s:.*<tool_call>.*)/\n"  # anything that does not open a call
        "OPEN: /(?s:.*<tool_call>)/ & ~/(?s:.*<tool_call>.+)/\n"  # anything up to the first opening
        f"calls: %json {_calls(tools, one_call)}\n",
        "strict tools' parameters",
    )


def _calls(tools: list[ToolSpec], one_call: bool) -> str:
    """The JSON schema of one `<tool_call>` block's list of calls of `tools`, as grammar text. Each strict function's
    parameters sit in the list's `$defs` (as `f<i>`, their own `$defs` beside them as `f<i>.<name>`), so the local
    references a schema makes (`#/$defs/X`, pydantic's nested models; `#/properties/...`; `#`) still point at its
    own parts."""
    defs, items = {}, []
    for i, t in enumerate(tools):
        args = {"type": "object"}
        if t.function.strict:
            own = {k: v for k, v in _strict_schema(t.function.parameters).items() if k not in ("$defs", "definitions")}
            defs[f"f{i}"] = _local_refs(own, i)
            for key in ("$defs", "definitions"):
                for name, sub in (t.function.parameters.get(key) or {}).items():
                    defs[f"f{i}.{name}"] = _local_refs(sub, i)
            args = {"$ref": f"#/$defs/f{i}"}
        items.append(
            {
                "type": "object",
                "properties": {"name": {"const": t.function.name}, "arguments": args},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    calls = {
        "x-guidance": SPACING,
        "type": "array",
        "minItems": 1,
        **({"maxItems": 1} if one_call else {}),
        "items": {"anyOf": items},
        **({"$defs": defs} if defs else {}),
    }
    return json.dumps(calls)


def _local_refs(schema, i: int):
    """`schema` (function i's parameters, or a part of them) with its local references moved to where `_calls` puts
    function i: `#/$defs/X` and `#/definitions/X` to `#/$defs/f<i>.X`, any other `#...` under `#/$defs/f<i>`."""
    if isinstance(schema, list):
        return [_local_refs(x, i) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _local_refs(v, i) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        for key in ("#/$defs/", "#/definitions/"):
            if ref.startswith(key):
                name, _, rest = ref[len(key) :].partition("/")
                out["$ref"] = f"#/$defs/f{i}.{name}" + (f"/{rest}" if rest else "")
                break
        else:
            out["$ref"] = f"#/$defs/f{i}{ref[1:]}"
    return out


def _strict_schema(parameters: dict) -> dict:
    return {"type": "object", **parameters, "x-guidance": SPACING}


def strict_arguments_grammar(spec, call_tokens: bool = False) -> str:
    """A forced call of a `strict` function (OpenAI's strict function calling): arguments that match its
    parameters exactly, then the markup that closes the call. ValueError when the compiler refuses the schema."""
    text = json.dumps(_strict_schema(spec.parameters))
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValueError(f"function {spec.name}'s parameters are {len(text)} characters; at most {MAX_SCHEMA_CHARS}")
    close = f'"}}]" {_close(True)}' if call_tokens else f'"}}]{CALL_CLOSE}"'
    lark = f"start: arguments {close}\narguments: %json {text}\n"
    return _checked(lark, f"function {spec.name}'s parameters")


def has_call_tokens(tok) -> bool:
    """Whether a tokenizer has `<tool_call>` and `</tool_call>` as added tokens of their own (Qwen2.5's and Qwen3's
    151657 and 151658, not special to transformers): llguidance reads every added token as a special one, so a grammar
    for that vocabulary names them as tokens (`<tool_call>`), or the model could only spell the markup out."""
    added = getattr(tok, "get_added_vocab", dict)()  # (a tokenizer with no added vocabulary has none)
    return all(t in added for t in (CALL_OPEN, CALL_CLOSE))


def _open(call_tokens: bool) -> str:
    return f'("{CALL_OPEN}" | {CALL_OPEN})' if call_tokens else f'"{CALL_OPEN}"'


def _close(call_tokens: bool) -> str:
    return f'("{CALL_CLOSE}" | {CALL_CLOSE})' if call_tokens else f'"{CALL_CLOSE}"'


def _checked(lark: str, what: str) -> str:
    error = _grammar_error(lark)
    if error:
        raise ValueError(f"{what}: {error.splitlines()[0][:300]}")
    return lark


@functools.lru_cache(maxsize=64)
def _grammar_error(lark: str) -> str:
    """What the compiler says is wrong with a grammar ("" when nothing): once per grammar text, as the edge checks a
    request's grammar before its turn builds the same one."""
    import llguidance

    return llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(lark)) or ""


def _lltokenizer(tok, eos: int):
    """llguidance's tokenizer of a Hugging Face fast tokenizer. A decoder that is a sequence holding a ByteLevel step (as
    transformers writes a GGUF conversion's, SmolLM2's) is given as that step alone, the way llguidance reads
    byte-level vocabularies; the ByteFallback and Replace steps beside it never apply to a byte-level vocabulary."""
    import llguidance

    with getattr(tok, "_lock", threading.Lock()):  # a LockedTokenizer's lock: another thread may be encoding
        spec = json.loads(tok.backend_tokenizer.to_str())
    dec = spec.get("decoder") or {}
    if dec.get("type") == "Sequence":
        spec["decoder"] = next((d for d in dec.get("decoders", []) if d.get("type") == "ByteLevel"), dec)
    spec["padding"] = spec["truncation"] = None
    return llguidance.LLTokenizer(json.dumps(spec), eos_token=eos)


class Grammars:
    """One engine's matchers: its tokenizer converted once (about a second), each grammar compiled once (the last
    `KEEP` kept) and copied for every row that follows it."""

    KEEP = 32

    def __init__(self, tok, eos: int):
        self.tok, self.eos, self._lt, self._lock, self._compiled = tok, eos, None, threading.Lock(), {}

    def matcher(self, lark: str):
        """A fresh matcher of `lark`; ValueError where it cannot be built (the caller's request alone fails)."""
        import llguidance

        with self._lock:
            if self._lt is None:
                self._lt = _lltokenizer(self.tok, self.eos)
            m = self._compiled.pop(lark, None)
            if m is None:
                m = llguidance.LLMatcher(self._lt, llguidance.LLMatcher.grammar_from_lark(lark), log_level=0)
                if m.is_error():
                    raise ValueError(f"the request's grammar: {m.get_error()[:300]}")
            self._compiled[lark] = m  # the newest last: the oldest goes first
            while len(self._compiled) > self.KEEP:
                self._compiled.pop(next(iter(self._compiled)))
            return m.deep_copy()

    def rows(self, torch, matchers: list, n_prompt: int):
        """The logits processor for a batch whose row i follows `matchers[i]` (None: free)."""
        return GrammarRows(torch, matchers, n_prompt, self._lt.vocab_size, self.eos)


class GrammarRows:
    """Logits processor: each constrained row may only take the tokens its matcher allows next, and only `eos` once
    its grammar is complete (a matcher stops by itself where nothing can follow). Called once per generated position:
    the row's last token (from the second call on) is fed to its matcher first."""

    def __init__(self, torch, matchers: list, n_prompt: int, vocab: int, eos: int):
        self.torch, self.matchers, self.n_prompt, self.vocab, self.eos = torch, matchers, n_prompt, vocab, eos

    def __call__(self, input_ids, scores):
        import llguidance.numpy as lln
        import numpy as np

        torch = self.torch
        bits = lln.allocate_token_bitmask(len(self.matchers), self.vocab)
        keep = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
        for i, m in enumerate(self.matchers):
            if m is None or m.is_error():  # free; an error comes only from the pad token of a row another criterion ended
                continue
            if input_ids.shape[1] > self.n_prompt and not m.is_stopped():
                m.consume_token(int(input_ids[i, -1]))
            if m.is_stopped():  # complete: the end token only (transformers pads the row once it took it)
                keep[i] = False
                keep[i, self.eos] = True
                continue
            lln.fill_next_token_bitmask(m, bits, i)
            n = min(self.vocab, scores.shape[1])  # the logits may be wider than the vocabulary
            allowed = np.unpackbits(bits[i].view(np.uint8), bitorder="little")[:n].astype(bool)
            keep[i] = False
            keep[i, :n] = torch.from_numpy(allowed).to(scores.device)
        return scores.masked_fill(~keep, float("-inf"))
