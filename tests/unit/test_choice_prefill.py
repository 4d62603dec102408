"""A group's samples each choose a function name from one context: `TransformersEngine.choose` keeps the prompt's
prefill (`KeptPrefill`) for the next choice on the same prompt and weights, and for the generation that follows it
(Serve's forced call), with the choices and tokens a fresh prefill gives. The explorer's engine shares a group's
prefills in generation too (`policies/engines/roles.SHARED_PREFILL`)."""

import pytest

from policies.chat import CALL_PREFIX, render


@pytest.fixture(scope="module")
def tiny_engine(tiny_dir):
    from policies.engines.engine import TransformersEngine

    return TransformersEngine(tiny_dir, dtype="float32")


def _count_prefills(engine):
    """Wrap the model: count its calls on more than one new token (prefills), not the one-token steps of a choice."""
    calls = []
    forward = engine.model.forward

    def counted(*args, **kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[-1] > 1:
            calls.append(ids.shape[-1])
        return forward(*args, **kwargs)

    engine.model.forward = counted
    return calls, lambda: setattr(engine.model, "forward", forward)


PROMPTS = [render([], None) + "Open the budget folder." + CALL_PREFIX, render([], None) + "Weather in Oslo?" + CALL_PREFIX]
OPTIONS = ['mkdir"', 'ls"', 'list_all_files"', 'cd"', 'get_weather"']


def test_repeated_choices_on_one_prompt_prefill_it_once_and_choose_as_a_fresh_prefill_does(tiny_engine):
    tiny_engine.kept.enabled = False
    fresh = [tiny_engine.choose(p, OPTIONS) for p in PROMPTS for _ in range(3)]
    tiny_engine.kept.enabled = True
    calls, undo = _count_prefills(tiny_engine)
    try:
        kept = [tiny_engine.choose(p, OPTIONS) for p in PROMPTS for _ in range(3)]
        sampled = [tiny_engine.choose(PROMPTS[1], OPTIONS, temperature=1.5) for _ in range(6)]
    finally:
        undo()
    assert kept == fresh and set(sampled) <= set(OPTIONS)
    assert len(calls) == 2  # one prefill per prompt, not one per choice
    kept = tiny_engine.kept
    assert kept.cache.get_seq_length() == len(kept.key[2])  # the prompt alone: the choices' tokens were cropped


def test_new_weights_or_another_prompt_prefill_again(tiny_engine):
    tiny_engine.choose(PROMPTS[0], OPTIONS)
    calls, undo = _count_prefills(tiny_engine)
    try:
        tiny_engine.choose(PROMPTS[0], OPTIONS)  # kept
        sd = {k: v.clone() for k, v in tiny_engine.model.state_dict().items()}
        tiny_engine.load_state_dict(sd, "w-000009")
        tiny_engine.choose(PROMPTS[0], OPTIONS)  # the same tokens, other weights
        tiny_engine.choose(PROMPTS[1], OPTIONS)
    finally:
        undo()
    assert len(calls) == 2


def test_the_explorer_shares_prefills_and_serving_does_not(tiny_dir):
    from config.settings import load_settings
    from policies.engines.roles import make_engine

    s = load_settings(None)
    s.model.serve_dtype = "float32"
    assert make_engine(s, tiny_dir, role="explorer").share_prefill
    assert not make_engine(s, tiny_dir, role="serve").share_prefill


def test_the_generation_after_a_choice_starts_from_its_prefill_and_writes_the_same_tokens(tiny_engine):
    from live_doubles import WEATHER  # tests/ is on sys.path

    from policies.chat import call_opening

    prompt = PROMPTS[1]
    opening = prompt[: -len(CALL_PREFIX)] + call_opening(WEATHER)
    tiny_engine.kept.enabled = False
    (plain,) = tiny_engine.generate([opening], 12)
    tiny_engine.kept.enabled = True
    tiny_engine.choose(prompt, OPTIONS)
    calls, undo = _count_prefills(tiny_engine)
    try:
        (reused,) = tiny_engine.generate([opening], 12)
        (again,) = tiny_engine.generate([opening], 12)  # nothing kept now: a full prefill
    finally:
        undo()
    assert reused.text == plain.text == again.text and reused.prompt_tokens == plain.prompt_tokens
    prompt_len = len(tiny_engine.tok(prompt, add_special_tokens=False)["input_ids"])
    full_len = len(tiny_engine.tok(opening, add_special_tokens=False)["input_ids"])
    assert calls == [full_len - prompt_len, full_len]  # the first ran only the tokens after the chosen prompt
    assert tiny_engine.kept.key is None
