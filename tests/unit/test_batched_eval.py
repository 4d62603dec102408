"""Held-out scoring batches several entries' episodes into one generation, with the same per-entry results."""

from actors.events import ChatMessage
from envs.base import StepResult
from policies.engines.generation import Generation
from policies.rollout import evaluate, run_episodes


class _Episode:
    """Entry `t<turns>_<answer>`: `turns` user turns, each solved by answering `answer`."""

    def __init__(self, entry_id: str):
        head, self.answer = entry_id.split("_")
        self.entry_id, self.turns, self.turn, self.right = entry_id, int(head[1:]), -1, 0
        self.tools, self.system_prompt = [], "sys"
        self.released = False

    def next_user_message(self):
        self.turn += 1
        return f"say {self.answer}" if self.turn < self.turns else None

    def step(self, action: ChatMessage) -> StepResult:
        self.right += action.content.strip() == self.answer
        return StepResult([], 1.0, True)

    def outcome(self) -> float:
        return self.right / self.turns

    def release(self):
        self.released = True


class _Env:
    def __init__(self):
        self.made = []

    def episode(self, entry_id, spec=None):
        self.made.append(_Episode(entry_id))
        return self.made[-1]


class _Engine:
    """Answers the number the last user turn asks for, except for entries ending in 9 (always wrong)."""

    def __init__(self):
        self.batches = []

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0):
        self.batches.append(len(prompts))
        out = []
        for p in prompts:
            want = p.rsplit("say ", 1)[1].split("<")[0].strip()
            out.append(Generation("0" if want.endswith("9") else want, 1, 1, "stop", "w-000000"))
        return out


def test_entries_with_different_numbers_of_turns_share_a_batch_and_score_as_alone():
    entries = ["t1_5", "t2_7", "t3_19", "t1_9"]
    alone_engine, env = _Engine(), _Env()
    alone = evaluate(alone_engine, env, entries, k=2, batch=1)
    batched_engine, env = _Engine(), _Env()
    together = evaluate(batched_engine, env, entries, k=2, batch=8)
    assert (
        together["entries"]
        == alone["entries"]
        == {"t1_5": [1.0, 1.0], "t2_7": [1.0, 1.0], "t3_19": [0.0, 0.0], "t1_9": [0.0, 0.0]}
    )
    assert together["avg"] == alone["avg"] == 0.5
    # one batch per turn round: 8 episodes, then the 4 with a second turn, then the 2 with a third
    assert batched_engine.batches == [8, 4, 2]
    assert alone_engine.batches == [2, 2, 2, 2, 2, 2, 2]
    assert all(ep.released for ep in env.made)


def test_run_episodes_returns_each_entrys_samples_in_order():
    groups = run_episodes(_Engine(), _Env(), ["t1_3", "t2_4"], 3, max_new_tokens=4, temperature=0.0)
    assert [len(g) for g in groups] == [3, 3]
    assert [s.messages[1].content for s in groups[0]] == ["say 3"] * 3
    assert [s.outcome for s in groups[1]] == [1.0, 1.0, 1.0]
    assert [len(s.step_indices) for s in groups[1]] == [2, 2, 2]


class _TwoToolEpisode(_Episode):
    """One turn with two declared functions; right when the call names `cd` with folder "b"."""

    def __init__(self, entry_id: str):
        super().__init__(entry_id)
        from actors.events import ToolSpec

        self.tools = [
            ToolSpec(function={"name": "ls", "parameters": {"type": "object", "properties": {}}}),
            ToolSpec(
                function={
                    "name": "cd",
                    "parameters": {"type": "object", "required": ["folder"], "properties": {"folder": {"type": "string"}}},
                }
            ),
        ]

    def step(self, action: ChatMessage) -> StepResult:
        self.right += [(c.name, c.arguments) for c in action.tool_calls] == [("cd", '{"folder": "b"}')]
        return StepResult([], 1.0, True)


class _ChoosingEngine(_Engine):
    """Picks `cd` when asked to choose, then writes the rest of its call; left to itself it names `rm`."""

    def __init__(self):
        super().__init__()
        self.asked = []

    def choose(self, prompt, options, temperature=0.0):
        self.asked.append((options, temperature))
        return 'cd"'

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0):
        self.batches.append(len(prompts))
        tail = ['b"}}]</tool_call>' if p.endswith('"folder": "') else 'rm", "arguments": {}}]</tool_call>' for p in prompts]
        return [Generation(t, 1, 1, "stop", "w-000000") for t in tail]


def test_a_forced_call_in_heldout_scoring_names_a_declared_function_as_serve_would():
    """Held-out scoring measures what a client asking for a call (tool_choice="required") gets: Serve picks the name
    among the declared functions with the policy's own probabilities, so the suite does too, at its temperature."""
    env, eng = _Env(), _ChoosingEngine()
    env.episode = lambda entry_id, spec=None: _TwoToolEpisode(entry_id)
    got = evaluate(eng, env, ["t1_x"], k=2, temperature=0.7, call_prefix=True, batch=2)
    assert got["entries"] == {"t1_x": [1.0, 1.0]}
    assert eng.asked == [(['ls"', 'cd"'], 0.7)] * 2
    free = evaluate(_ChoosingEngine(), env, ["t1_x"], k=2, call_prefix=False)  # no forced call: nothing is chosen
    assert free["entries"] == {"t1_x": [0.0, 0.0]}


class _RamblingEngine(_ChoosingEngine):
    """Writes the right call, then rambles on into a second call block of a function nobody declared."""

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0):
        tail = 'b"}}]</tool_call>\nOr maybe <tool_call>[{"name": "rm", "arguments": {"path": "/"}}]</tool_call>'
        return [Generation(tail, 9, 9, "length", "w-000000") for _ in prompts]


def test_heldout_scoring_scores_the_answer_serve_sends_and_the_explorer_the_text_as_written():
    """Serve leaves out a forced answer's later calls a client cannot run (`trusted_calls`); held-out scoring scores
    that answer. The explorer's samples keep what was written, so the rambling still counts against them."""
    from policies.rollout import run_group

    env = _Env()
    env.episode = lambda entry_id, spec=None: _TwoToolEpisode(entry_id)
    got = evaluate(_RamblingEngine(), env, ["t1_x"], k=2, temperature=0.7, call_prefix=True, batch=2)
    assert got["entries"] == {"t1_x": [1.0, 1.0]}
    group = run_group(_RamblingEngine(), env, "t1_x", 2, max_new_tokens=9, temperature=0.7, call_prefix=True, choose_names=True)
    assert [s.outcome for s in group.samples] == [0.0, 0.0]
    assert [c.name for c in group.samples[0].messages[2].tool_calls] == ["cd", "rm"]
