"""`main.py join` (deploy/join.py) and the head's side of several hosts, without Ray: the worker node's environment and
command, the token it must be given, and an embedded nats-server on an address other than 127.0.0.1.
tests/benchmarks/two_hosts.py runs the whole of it across two network namespaces."""

import argparse
import socket

import pytest

from config.settings import load_settings
from deploy.join import join, start_command, worker_env
from deploy.nats import EmbeddedNats


def _settings(tmp_path):
    s = load_settings(None)
    s.state_dir = str(tmp_path / "st")
    s.state.mkdir(parents=True)
    return s


def test_a_worker_node_gets_ups_ray_environment_without_the_loopback_hold(tmp_path):
    s = _settings(tmp_path)
    (s.state / "ray_auth_token").write_text("head-token")
    env = worker_env(s)
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env  # `ray start --address` refuses to run with it
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(s.state / "ray_auth_token")
    assert env["RAY_USAGE_STATS_ENABLED"] == "0" and env["OMP_NUM_THREADS"] == "1"
    assert (s.state / "ray_auth_token").read_text() == "head-token"


def test_the_worker_node_command_names_the_head_this_host_and_its_own_temp_dir(tmp_path):
    s = _settings(tmp_path)
    cmd = start_command(s, "10.0.0.1:6379", "10.0.0.2", 1, 0)
    assert cmd[1] == "start" and "--block" in cmd
    assert {"--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2", "--num-cpus=1", "--num-gpus=0"} <= set(cmd)
    assert (f"--temp-dir={s.state / 'ray'}" in cmd) == (len(str(s.state / "ray")) <= 40)


def test_join_refuses_to_start_without_the_heads_token(tmp_path):
    s = _settings(tmp_path)
    args = argparse.Namespace(address="127.0.0.1:1", node_ip="127.0.0.1", num_cpus=1, num_gpus=0, head_grace=1.0)
    with pytest.raises(SystemExit, match="ray_auth_token"):
        join(s, args)
    assert not (s.state / "ray_auth_token").exists()  # a token of its own would be refused by the head


def test_the_embedded_nats_server_listens_on_the_address_it_is_given(tmp_path):
    server = EmbeddedNats(tmp_path / "n", sync_always=False, host="127.0.0.2").start()
    try:
        assert server.url == f"nats://127.0.0.2:{server.port}"
        socket.create_connection(("127.0.0.2", server.port), timeout=2).close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    finally:
        server.stop()
