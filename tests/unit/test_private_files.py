"""The secrets a deployment makes for itself (config.private.secret_file): made once, owner-only, and when two
processes make one at once, both read the one that was made first."""

import os
import stat

from config.private import secret_file


def test_a_secret_is_made_once_owner_only_and_read_back(tmp_path):
    path = tmp_path / "state" / "secrets" / "token"
    value = secret_file(path)
    assert len(value) >= 32 and secret_file(path, lambda: "other") == value  # a restart reads the same
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["token"]
    assert secret_file(tmp_path / "other", lambda: "made") == "made"


def test_of_two_makers_at_once_the_first_file_is_kept(tmp_path, monkeypatch):
    path = tmp_path / "token"
    real_open = os.open

    def other_process_first(p, flags, mode=0o777):
        if str(p) == str(path) and not path.exists():
            path.write_text("first\n")  # another replica made it between our check and our create
        return real_open(p, flags, mode)

    monkeypatch.setattr(os, "open", other_process_first)
    assert secret_file(path, lambda: "second") == "first"
    assert path.read_text() == "first\n"


def test_the_deployments_secrets_are_made_by_it(tmp_path):
    from deploy.nats import EmbeddedNats
    from deploy.ray_local import ray_auth_env
    from serve.interactions import user_salt

    nats = EmbeddedNats(tmp_path)
    token = ray_auth_env(tmp_path)["RAY_AUTH_TOKEN_PATH"]
    salt = user_salt(tmp_path)
    for name in ("nats.password", "ray_auth_token", "secrets/user_salt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert nats.password == (tmp_path / "nats.password").read_text() and EmbeddedNats(tmp_path).password == nats.password
    assert len(bytes.fromhex(open(token).read())) == 32 and user_salt(tmp_path) == salt


def test_a_secret_left_empty_is_waited_for_then_refused_by_name(tmp_path, monkeypatch):
    import time

    import pytest

    path = tmp_path / "token"
    path.write_text("")  # made by another process that has not written it yet, or a write cut off
    waits = []
    monkeypatch.setattr(time, "sleep", lambda s: waits.append(s) or (path.write_text("late") if len(waits) == 3 else None))
    assert secret_file(path) == "late" and len(waits) == 3  # the other process wrote it meanwhile
    path.write_text("")
    waits.clear()
    monkeypatch.setattr(time, "sleep", lambda s: waits.append(s))
    with pytest.raises(ValueError, match="is empty"):
        secret_file(path)
