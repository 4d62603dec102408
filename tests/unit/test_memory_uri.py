"""The experience pool is reached by URI: Milvus Lite in the state dir by default, a Milvus server (with its token)
when `memory.uri` is set; closing a server's client never touches Milvus Lite's in-process servers."""

import pytest

from policies.memory.pool import MemoryPool, is_server


class _Client:
    made = []

    def __init__(self, uri, token=""):
        self.uri, self.token, self.closed = uri, token, False
        _Client.made.append(self)

    def has_collection(self, name):
        raise RuntimeError("server unreachable")  # stops the constructor after the client is made

    def close(self):
        self.closed = True


def test_a_server_uri_and_its_token_reach_the_client_and_its_errors_are_not_a_lite_file_to_move(monkeypatch):
    import pymilvus

    monkeypatch.setattr(pymilvus, "MilvusClient", _Client)
    released = []
    monkeypatch.setattr("milvus_lite.server_manager.server_manager_instance.release_server", released.append)
    with pytest.raises(RuntimeError, match="unreachable"):
        MemoryPool.open("http://milvus:19530", 384, token="root:Milvus")
    c = _Client.made[-1]
    assert (c.uri, c.token, c.closed) == ("http://milvus:19530", "root:Milvus", True) and released == []
    assert is_server("https://x:443") and not is_server("/state/milvus/experiences.db")
