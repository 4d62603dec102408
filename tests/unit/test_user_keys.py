"""Per-user API keys (`serve.user_keys_file`): a request with one is its named holder, whatever its `user` says, so
one key holder cannot become many users to the per-user caps by sending a new `user` with every request; the
deployment key's clients keep naming their users by `user`; the page and /metrics take the deployment key alone."""

import asyncio
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from actors.events import ChatMessage, RetrieveReply
from serve.interactions import Turn
from serve.net import Keys, authorized, load_user_keys, read_body
from serve.schemas import ChatRequest

MAIN = "deployment-key-0123456789"
ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"


def _keys_file(tmp_path, text):
    path = tmp_path / "user_keys"
    path.write_text(text)
    return path


def _req(token):
    return SimpleNamespace(headers={"authorization": f"Bearer {token}"} if token is not None else {})


def test_a_keys_file_names_each_key_and_skips_comments_and_blank_lines(tmp_path):
    path = _keys_file(tmp_path, f"# the team\nalice {ALICE}\n\n  bob@example.com\t{BOB}  \n")
    assert load_user_keys(path, MAIN) == {ALICE: "alice", BOB: "bob@example.com"}
    assert load_user_keys(None, MAIN) == {} and load_user_keys("", MAIN) == {}


@pytest.mark.parametrize(
    "text, problem",
    [
        (f"alice {ALICE} extra", "line 1: expected `name key`, got 3 fields"),
        ("alice", "line 1: expected `name key`, got 1 fields"),
        (f"al/ice {ALICE}", "line 1: the name must be"),
        ("alice short-key", "line 1: the key of 'alice' is shorter than 16"),
        (f"alice {ALICE}\n# again\nalice {BOB}", "line 3: the name 'alice' is given twice"),
        (f"alice {ALICE}\nbob {ALICE}", "line 2: that key is given twice"),
        (f"alice {MAIN}", "line 1: the key of 'alice' is the deployment's own key"),
    ],
)
def test_a_malformed_keys_file_is_refused_naming_its_line(tmp_path, text, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        load_user_keys(_keys_file(tmp_path, text), MAIN)


def test_who_holds_a_requests_key():
    keys = Keys(MAIN, {ALICE: "alice", BOB: "bob"})
    assert keys.holder(_req(MAIN)) == ""  # the deployment's key: its clients say who their users are
    assert keys.holder(_req(ALICE)) == "alice" and keys.holder(_req(BOB)) == "bob"
    assert keys.holder(SimpleNamespace(headers={"authorization": f"bearer {ALICE}"})) == "alice"  # any case of the scheme
    for bad in ("nope-0123456789abcdef", ALICE[:-1], "", None):
        assert keys.holder(_req(bad)) is None
    assert keys.holder(SimpleNamespace(headers={"authorization": f"Basic {ALICE}"})) is None
    # the page and /metrics: the deployment's key alone
    assert authorized(_req(MAIN), MAIN) and not authorized(_req(ALICE), MAIN)


def _user_hash(holder="", user=None, peer="10.0.0.1"):
    body = {"messages": [{"role": "user", "content": "hi"}], **({"user": user} if user else {})}
    turn = Turn(
        req=ChatRequest.model_validate(body), messages=[], tools=[], memory=RetrieveReply(), prompt="p", peer=peer, holder=holder
    )
    answer = ChatMessage(role="assistant", content="hello")
    return turn.interaction(answer, "w-1", False, "r0", MAIN, b"s" * 32).user_hash


def test_a_user_key_is_one_user_whatever_user_it_sends():
    one = {_user_hash("alice", user, peer) for user in (None, "u1", "u2", "u3") for peer in ("10.0.0.1", "10.0.0.2")}
    assert len(one) == 1  # a burst of fresh `user` names from one key holder is one user to every per-user cap
    assert _user_hash("bob") not in one
    # the deployment key's clients: `user` names the user, as before
    assert _user_hash("", "u1") != _user_hash("", "u2") and _user_hash("", "u1", "10.0.0.1") == _user_hash("", "u1", "10.0.0.2")
    # no `user` a deployment-key client sends is taken for a key holder: the holders' hashes have a salt of their own
    assert all(_user_hash("", forged) not in one for forged in ("alice", "key:alice", "alice|" + MAIN[:8]))


def _request(token: str, body: bytes = b'{"messages": []}') -> Request:
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    headers = [(b"authorization", f"Bearer {token}".encode()), (b"content-length", str(len(body)).encode())]
    return Request({"type": "http", "method": "POST", "path": "/v1/feedback", "headers": headers}, receive)


def test_every_v1_body_takes_a_user_key_and_refuses_an_unknown_one():
    keys = Keys(MAIN, {ALICE: "alice"})
    for token in (MAIN, ALICE):
        body, err = asyncio.run(read_body(_request(token), keys, 1000))
        assert err is None and body == {"messages": []}
    body, err = asyncio.run(read_body(_request(BOB), keys, 1000))
    assert body is None and err.status_code == 401


def test_the_keys_file_reaches_every_replica_from_where_the_app_is_built(tmp_path):
    from config.settings import load_settings
    from serve.app import build_app

    s = load_settings(None)
    s.state_dir = str(tmp_path)
    assert build_app(s, MAIN)._bound_deployment.init_args[3] == {}
    s.serve.user_keys_file = str(_keys_file(tmp_path, f"alice {ALICE}\n"))
    assert build_app(s, MAIN)._bound_deployment.init_args[3] == {ALICE: "alice"}
    s.serve.user_keys_file = str(_keys_file(tmp_path, f"alice {MAIN}\n"))
    with pytest.raises(ValueError, match="the deployment's own key"):  # refused where `up` starts, before any replica
        build_app(s, MAIN)


def test_up_stops_at_a_malformed_keys_file_before_starting_anything(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    preset = yaml.safe_load((root / "config" / "cpu.yaml").read_text())
    preset["serve"]["user_keys_file"] = str(_keys_file(tmp_path, f"alice {ALICE}\nbob short\n"))
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump(preset))
    env = {**os.environ, "KAIZEN_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run(
        [sys.executable, str(root / "main.py"), "up", "--config", str(tmp_path / "preset.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "line 2: the key of 'bob' is shorter than 16" in r.stderr, r.stderr[-1000:]
    assert not (tmp_path / "state" / "nats").exists() and not (tmp_path / "state" / "run.json").exists()
