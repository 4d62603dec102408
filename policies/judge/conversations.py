"""Conversations from separate requests, and what happens next as a signal on each served step.

An agent client's conversation is several requests: the model calls the client's tool, the next request
carries the tool's result (`role: tool`), then the user's next message. Nothing on the client marks them as
one conversation, so they are stitched by content: an interaction registers the key of its messages plus its
answer (`step_key`); a later request whose messages, up to their last assistant message, have that key
(`parent_key`) extends it. Keys are per user (`Interaction.user_hash`: the request's `user` field, else the
client's address) and, when the client sent one, per explicit conversation key (`metadata.conversation_id`,
`thread_id` or `session_id`), so two users asking the same thing never merge. With an explicit key, a request whose history the
client edited or cut (so no key matches) joins that key's open conversation. Message ids, whitespace and argument key order
do not count (clients re-serialise what they were sent), nor do system messages (clients put the time there).

Each assistant answer is a step, with the weights version that wrote it. When the next request of the
conversation arrives, what it adds after the step (tool results, the user's next message) gives the step a
signal by `SIGNALS` below; a conversation idle for `idle_s` closes, and its last step gets its signal then. A call
that does not fit the tools the request declared (`envs/tool_fit.py`) is wrong whatever comes next: that needs no next turn.
Explicit feedback, when a step has some before its conversation closes, overrides all of these (the rated path trains
on it); after, the step has trained on its signal and the rating is only recorded.

Text in a tool result or a user turn is only ever matched against fixed patterns here: it is data, never an
instruction to the system, and nothing in it is executed or followed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from actors.events import ChatMessage, Interaction, ToolSpec
from envs.live import call_key
from envs.tool_fit import misfit
from policies.hygiene import scrub
from policies.judge.next_turn import signal_of
from policies.learning.hindsight import HINT_CHARS, HINTED, next_turn


@dataclass(frozen=True)
class Rule:
    name: str
    value: float  # in [-1, 1]: what the step is worth when this is what happened next
    confidence: float  # in (0, 1]: how sure this rule is; a step's outcome is value x confidence
    when: str


# Checked in this order: the first that matches is the step's signal.
SIGNALS: tuple[Rule, ...] = (
    Rule(
        "feedback",
        0.0,
        1.0,
        "the user rated the step (POST /v1/feedback): the rating is the value, and it overrides every rule below",
    ),
    Rule(
        "invalid_call",
        -1.0,
        0.9,
        "a call of the step does not fit the tools the request declared: an undeclared function or parameter, a "
        "required parameter left out, a value of the wrong type or outside its enum (known from the step itself; a "
        "tool result that came back fine, or the user's thanks, outweighs it)",
    ),
    Rule(
        "correction",
        -1.0,
        0.8,
        'the user\'s next message says the answer was wrong ("no", "wrong", "that is not what I asked", "try again", '
        '"not great", "still fails", ...)',
    ),
    Rule(
        "reask",
        -1.0,
        0.7,
        "the user's next message asks the same thing again (>= 60% of its content words, at least 2, repeat the "
        "previous request) and is not the answer to a question the step asked",
    ),
    Rule(
        "tool_error",
        -0.6,
        0.7,
        "a tool result answering the step's call reports a failure: in JSON a non-empty error, success or ok false, a "
        "failing status; in text its first line (error, not found, invalid, failed, denied, ...) or a traceback",
    ),
    Rule(
        "abandoned_call",
        -0.3,
        0.3,
        "the step's tool call was never answered: the conversation went idle, or went on without its result",
    ),
    Rule(
        "thanks",
        1.0,
        0.6,
        'the user\'s next message thanks ("thanks", "that works", ...) or opens with approval ("great", "perfect", ...), '
        'with no "but"',
    ),
    Rule("tool_ok", 0.2, 0.4, "every tool result answering the step's calls came back without a failure"),
    Rule("moved_on", 0.3, 0.3, "the user's next message is a new request (none of the above)"),
)
RULES = {r.name: r for r in SIGNALS}


def _canon(m: ChatMessage) -> list:
    return [m.role, " ".join((m.content or "").split()), call_key(m) if m.tool_calls else []]


def _key(scope: str, messages: list[ChatMessage]) -> str:
    """System messages do not count: clients put per-request state there (the time, a scratchpad)."""
    canon = [_canon(m) for m in messages if m.role != "system"]
    return hashlib.sha256(json.dumps([scope, canon]).encode()).hexdigest()[:32]


def scope_of(it: Interaction) -> str:
    return f"{it.user_hash}|{it.conversation or ''}"


def step_key(it: Interaction) -> str:
    """What a request that extends this interaction will find: its messages and its answer."""
    return _key(scope_of(it), list(it.messages) + [it.response])


def parent_key(it: Interaction) -> str | None:
    """The key of the interaction this request extends, if it carries an earlier answer: its messages up to and
    including the last assistant one."""
    last = max((i for i, m in enumerate(it.messages) if m.role == "assistant"), default=None)
    return None if last is None else _key(scope_of(it), list(it.messages[: last + 1]))


def hint_of(signal: str | None, served: ChatMessage, after: list[ChatMessage], tools: list[ToolSpec]) -> str:
    """The hindsight hint of a step whose signal says what was wrong: its next turn, led, for a call that does not
    fit the declared tools, by why it does not fit; scrubbed of personal data, then cut to `HINT_CHARS`."""
    if signal not in HINTED:
        return ""
    nxt = next_turn(after)
    if signal == "invalid_call":
        nxt = f"tool: Error: {scrub(misfit(served.tool_calls, tools))}" + (f"\n{nxt}" if nxt else "")
    return nxt[:HINT_CHARS]


@dataclass
class Step:
    interaction: Interaction
    signal: str | None = None  # a rule's name once what came next is known
    rated: bool = False  # explicit feedback arrived for it: the rated path trains on it
    hint: str = ""  # the next turn, when its signal says what was wrong (policies/learning/hindsight.py)

    @property
    def outcome(self) -> float:
        r = RULES[self.signal] if self.signal else None
        return round(r.value * r.confidence, 4) if r else 0.0


@dataclass
class Conversation:
    conversation_id: str  # the first interaction's id
    scope: str
    steps: list[Step] = field(default_factory=list)
    last_at: float = 0.0
    orphan_of: str = ""  # the parent key it waits under, when it began with a request whose earlier one has not come

    @property
    def user(self) -> str:
        return self.scope.split("|", 1)[0]  # `scope_of`: the user's hash, then the explicit conversation key


class ConversationBook:
    """Open conversations, bounded: at most `max_open`, each at most `max_steps` steps (the oldest close first);
    a conversation idle for `idle_s` closes. A full one closes when the next request comes, which gives its last step
    its signal and starts the conversation's next part. When the book is full, a user with more than a quarter of `max_open` (at
    least 2) open, explicit keys or not, loses their own oldest first: one user's burst does not close everyone else's."""

    def __init__(self, idle_s: float = 300.0, max_open: int = 200, max_steps: int = 16):
        self.idle_s, self.max_open, self.max_steps = idle_s, max_open, max_steps
        self.max_per_user = max(2, max_open // 4)
        self.open: dict[str, Conversation] = {}  # conversation id -> conversation
        # step key -> the open conversations whose newest step it is, oldest first: two identical sessions of one user
        # (the same question, the same answer) are two conversations, and each next request joins one of them
        self.by_key: dict[str, list[str]] = {}
        self.rated: dict[str, None] = {}  # interaction ids users rated (their feedback may come first), bounded
        self.orphans: dict[str, list[str]] = {}  # parent key -> open conversations that began with a later request
        self.threads: dict[str, str] = {}  # scope with an explicit conversation key -> its open conversation

    def add(self, it: Interaction, now: float) -> tuple[Conversation, list[str]]:
        """Join the interaction to the conversation it extends (giving that conversation's last step its signal)
        or start one. Returns it, and the ids of the conversations to close to stay within bounds (`close`)."""
        conv = self.open.get(self._take(self.by_key, parent_key(it) or ""))
        if conv is None and (conv := self._thread(it)) is not None:
            self._unkey(conv.conversation_id)  # its stale step key
        full = ""
        if conv is not None:
            self._signal(conv.steps[-1], it)
            if len(conv.steps) >= self.max_steps:  # full: its last step has its signal, and this request starts the next
                full, conv = conv.conversation_id, None
        if conv is None:
            conv = self.open[it.interaction_id] = Conversation(it.interaction_id, scope_of(it))
            if (key := parent_key(it)) and not full:
                self.orphans.setdefault(key, []).append(conv.conversation_id)
                conv.orphan_of = key
        conv.steps.append(Step(it, rated=it.interaction_id in self.rated))
        conv.last_at = max(conv.last_at, now)  # `now`: when the request came (redeliveries come out of order)
        if (later := self.open.pop(self._take(self.orphans, step_key(it)), None)) is not None:
            # a later request of this conversation came first (redelivered out of order after a restart)
            self._signal(conv.steps[-1], later.steps[0].interaction)
            conv.steps += later.steps
            conv.last_at = max(now, later.last_at)
            self._unkey(later.conversation_id, conv.conversation_id)
        else:
            self.by_key.setdefault(step_key(it), []).append(conv.conversation_id)
        if it.conversation:
            self.threads[conv.scope] = conv.conversation_id
        # a full conversation closes once the request after its last step gave that step its signal (or when idle)
        over = [full] if full else [conv.conversation_id] if len(conv.steps) > self.max_steps else []
        if (excess := len(self.open) - len(over) - self.max_open) > 0:  # full: this user's own oldest first, if many
            oldest = sorted((c for c in self.open.values() if c.conversation_id not in over), key=lambda c: c.last_at)
            mine = [c for c in oldest if c.user == conv.user]
            own = [c.conversation_id for c in mine[: max(0, min(excess, len(mine) - self.max_per_user))]]
            over += own + [c.conversation_id for c in oldest if c.conversation_id not in own][: excess - len(own)]
        return conv, over

    @staticmethod
    def _take(keys: dict[str, list[str]], key: str) -> str:
        """The oldest open conversation under this key (`by_key` or `orphans`), taken off it ("" when none)."""
        cid = (ids := keys.get(key) or [""]).pop(0)
        if not ids:
            keys.pop(key, None)
        return cid

    def _unkey(self, conversation_id: str, to: str | None = None, keys: dict | None = None) -> None:
        """Take a conversation's step keys (or `keys`: its parent keys) off the book, or give them to conversation `to`."""
        for key, ids in list((self.by_key if keys is None else keys).items()):
            ids[:] = [to if c == conversation_id else c for c in ids if c != conversation_id or to is not None]
            if not ids:
                del (self.by_key if keys is None else keys)[key]

    def _thread(self, it: Interaction) -> Conversation | None:
        """The open conversation of the request's explicit key, when its messages do not extend it as sent: the client
        edited or cut the history. Not for a request that carries more answers than that conversation has steps:
        that is a later request come first (an orphan), not an edit."""
        conv = self.open.get(self.threads.get(scope_of(it), "")) if it.conversation else None
        answers = [m for m in it.messages if m.role == "assistant"]
        if conv is None or not 0 < len(answers) <= len(conv.steps):
            return None
        # a retry of an earlier request carries an earlier answer last: it is not the next turn of the newest step
        return conv if _canon(answers[-1]) == _canon(conv.steps[-1].interaction.response) else None

    @staticmethod
    def _signal(prev: Step, it: Interaction) -> None:
        """`prev`'s signal from the request `it` that extends it."""
        n = max(i for i, m in enumerate(it.messages) if m.role == "assistant") + 1  # the step, as `parent_key` found it
        user = next((m.content for m in reversed(prev.interaction.messages) if m.role == "user"), None)
        # the answer as the client sent it back (its tool call ids are the ones its tool results answer)
        step, after, served, tools = it.messages[n - 1], list(it.messages[n:]), prev.interaction.response, prev.interaction.tools
        prev.signal = signal_of(step, after, user, tools, served)
        prev.hint = hint_of(prev.signal, served, after, tools)

    def rate(self, interaction_id: str) -> None:
        """A user rated this interaction: its step trains on the rating, not on a signal (whichever came first)."""
        self.rated[interaction_id] = None
        while len(self.rated) > 10_000:
            del self.rated[next(iter(self.rated))]
        for conv in self.open.values():
            for st in conv.steps:
                if st.interaction.interaction_id == interaction_id:
                    st.rated = True

    def holds(self, interaction_id: str) -> bool:
        return any(st.interaction.interaction_id == interaction_id for c in self.open.values() for st in c.steps)

    def reopen(self, conv: Conversation) -> None:
        """Put back a conversation whose close could not be carried out (the bus was down, say)."""
        self.open[conv.conversation_id] = conv
        self.by_key.setdefault(step_key(conv.steps[-1].interaction), []).insert(0, conv.conversation_id)  # the older
        if conv.orphan_of:  # still waiting for its earlier request: that request, when it comes, joins it
            self.orphans.setdefault(conv.orphan_of, []).insert(0, conv.conversation_id)
        if conv.steps[-1].interaction.conversation:
            self.threads[conv.scope] = conv.conversation_id

    def close(self, conversation_id: str, idle: bool = True) -> Conversation:
        """Take a conversation out of the book, its last step signalled if it can be. `idle`: it went quiet, so a
        call never answered was abandoned; closed to stay within bounds instead (`add`'s list), an unanswered call
        gets no signal: its result may still be on its way."""
        conv = self.open.pop(conversation_id)
        self._unkey(conversation_id)
        self._unkey(conversation_id, keys=self.orphans)
        if self.threads.get(conv.scope) == conversation_id:
            del self.threads[conv.scope]
        last = conv.steps[-1]
        step, tools = last.interaction.response, last.interaction.tools
        if last.signal is None:  # nothing came after it: a call that does not fit, or one never answered
            last.signal = signal_of(step, [], None, tools) or ("abandoned_call" if step.tool_calls and idle else None)
            last.hint = hint_of(last.signal, step, [], tools)
        return conv

    def idle(self, now: float) -> list[str]:
        return [c for c, conv in self.open.items() if now - conv.last_at >= self.idle_s]
