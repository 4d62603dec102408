"""The KubeRay entry points (deploy/kuberay.py) without a cluster: the Serve args, the `Evolution` deployment's
start / health logic over stand-ins for the stream and the actor start, and `start_actors(detached=True)`."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from config.settings import load_settings
from deploy import kuberay, launch, ray_local


def _args(tmp_path, config="config/k8s.yaml", **extra) -> dict:
    (tmp_path / "api-key").write_text("sk-test\n")
    (tmp_path / "nats-password").write_text("kpass\n")
    return {
        "config": config,
        "state_dir": str(tmp_path / "state"),
        "nats_url": "nats://kaizen-nats:4222",
        "nats_password_file": str(tmp_path / "nats-password"),
        "api_key_file": str(tmp_path / "api-key"),
        **extra,
    }


def test_the_args_become_settings_with_the_secrets_read_from_their_files(tmp_path):
    s = kuberay.settings_from_args(_args(tmp_path))
    assert (s.state_dir, s.nats.url, s.nats.password, s.serve.api_key) == (
        str(tmp_path / "state"),
        "nats://kaizen-nats:4222",
        "kpass",
        "sk-test",
    )
    assert s.nats.replicas == 3 and s.judge.base_url is None


def test_self_endpoints_point_at_the_api_inside_the_cluster(tmp_path):
    s = kuberay.settings_from_args(_args(tmp_path, "config/gpu-7b.yaml", own_url="http://kaizen-serve-svc:8000/v1"))
    assert (s.judge.base_url, s.judge.api_key) == ("http://kaizen-serve-svc:8000/v1", "sk-test")
    assert (s.questioner.generator_base_url, s.questioner.generator_api_key) == ("http://kaizen-serve-svc:8000/v1", "sk-test")
    # our endpoint answers only the served model's name (the first GPU `up` got 404s for 'judge' and 'generator')
    assert s.judge.model == s.questioner.generator_model == s.model.name == "Qwen2-7B-Instruct"


def test_a_model_named_for_the_self_judge_is_kept():
    s = load_settings("config/gpu-7b.yaml", **{"judge.model": "critic", "serve.model_aliases": ["critic"]})
    launch.use_own_endpoint(s, "http://127.0.0.1:8000/v1")
    assert (s.judge.model, s.questioner.generator_model) == ("critic", "Qwen2-7B-Instruct")


def test_no_key_is_refused(tmp_path):
    args = _args(tmp_path)
    del args["api_key_file"]
    with pytest.raises(ValueError, match="api_key_file"):
        kuberay.settings_from_args(args)


def test_the_cluster_preset_is_the_gpu_preset_with_five_changes():
    def flat(d, p=""):
        return {
            k: v
            for key, val in d.items()
            for k, v in (flat(val, f"{p}{key}.").items() if isinstance(val, dict) else [(p + key, val)])
        }

    k8s, gpu = flat(load_settings("config/k8s.yaml").model_dump()), flat(load_settings("config/gpu.yaml").model_dump())
    assert {k: v for k, v in k8s.items() if gpu[k] != v} == {
        "nats.replicas": 3,
        "weights.store": "nats",
        "serve.weights_transport": "file",
        "model.source": "hf-folder",
        "model.path": "/opt/kaizen/model/smollm2-135m-instruct",
    }


class _Handle:
    """An actor handle whose `pid()` calls answer when the test says (`probes`: the futures, newest last)."""

    def __init__(self):
        self.probes: list[Future] = []
        self.pid = self

    def remote(self):
        self.probes.append(Future())
        return self

    def future(self) -> Future:
        return self.probes[-1]


class _Cluster:
    """Stand-ins for NATS and Ray: which calls the deployment made, and failures to inject."""

    def __init__(self, monkeypatch, nats_down: int = 0):
        self.streams, self.starts, self.nats_down, self.start_error = 0, [], nats_down, None
        self.handles = {name: _Handle() for name in ray_local.ACTORS}

        async def ensure_stream(s, attempts=-1):
            assert attempts == kuberay.NATS_ATTEMPTS  # bounded: a replica must be able to say it failed
            if self.nats_down > 0:
                self.nats_down -= 1
                raise ConnectionError("nats: no servers available for connection")
            self.streams += 1

        def start_actors(s, detached=False):
            if self.start_error:
                raise self.start_error
            self.starts.append(detached)
            return self.handles

        monkeypatch.setattr(launch, "ensure_stream", ensure_stream)
        monkeypatch.setattr(ray_local, "start_actors", start_actors)


async def _replica(tmp_path):
    cls = kuberay.Evolution.func_or_class
    replica = cls.__new__(cls)  # as Serve builds one: its __init__ is a coroutine
    await replica.__init__(kuberay.settings_from_args(_args(tmp_path)).model_dump_json())
    return replica


async def test_the_replica_starts_the_actors_detached_and_the_health_check_restarts_lost_ones(tmp_path, monkeypatch):
    c = _Cluster(monkeypatch)
    replica = await _replica(tmp_path)
    assert (c.streams, c.starts) == (1, [True])
    await replica.check_health()
    assert (c.streams, c.starts) == (1, [True, True])  # the stream once; the actors each time (only missing ones start)
    assert (await replica())["actors"] == [f"kaizen-{n}" for n in ray_local.ACTORS]


async def test_unhealthy_while_the_actors_cannot_start_and_healthy_once_they_can(tmp_path, monkeypatch):
    c = _Cluster(monkeypatch, nats_down=2)
    replica = await _replica(tmp_path)  # NATS still starting: the constructor does not fail...
    assert c.starts == []
    with pytest.raises(RuntimeError, match="no servers available"):  # ...the health check says why
        await replica.check_health()
    await replica.check_health()  # NATS is up: stream, then actors
    assert (c.streams, c.starts) == (1, [True])
    c.start_error = RuntimeError("actor constructor failed")
    with pytest.raises(RuntimeError, match="actor constructor failed"):
        await replica.check_health()
    assert "actor constructor failed" in (await replica())["error"]


async def test_an_actor_whose_constructor_raises_is_reported_and_one_still_loading_is_not(tmp_path, monkeypatch):
    c = _Cluster(monkeypatch)
    replica = await _replica(tmp_path)
    learner = c.handles["learner"]
    assert all(len(h.probes) == 1 for h in c.handles.values())  # one pid() call in flight per actor
    await replica.check_health()  # nothing answered yet (models loading): healthy, no second call
    assert all(len(h.probes) == 1 for h in c.handles.values())
    learner.probes[0].set_exception(RuntimeError("The actor died because of an error raised in its creation task"))
    for name, h in c.handles.items():
        if name != "learner":
            h.probes[0].set_result(7)
    with pytest.raises(RuntimeError, match="learner: The actor died"):
        await replica.check_health()  # and start_actors was called again, which starts a new learner
    assert all(len(h.probes) == 2 for h in c.handles.values())
    learner.probes[1].set_result(8)
    await replica.check_health()  # the new learner answered


def test_both_applications_build_from_the_same_args(tmp_path):
    from ray.serve import Application

    args = _args(tmp_path)
    assert isinstance(kuberay.evolution_app(args), Application) and isinstance(kuberay.api_app(args), Application)


def test_detached_actors_are_named_and_started_only_where_none_runs(monkeypatch):
    import ray

    calls = []

    class Remote:
        def options(self, **kw):
            calls.append(kw)
            return self

        def remote(self, target, settings_json):
            return target

    monkeypatch.setattr(ray, "remote", lambda cls: Remote())
    s = load_settings("config/k8s.yaml")
    assert ray_local.start_actors(s, detached=True) == ray_local.ACTORS
    assert [c["name"] for c in calls] == [f"kaizen-{n}" for n in ray_local.ACTORS]
    assert all(
        c["lifetime"] == "detached" and c["get_if_exists"] and c["namespace"] == ray_local.NAMESPACE and c["max_restarts"] == -1
        for c in calls
    )
    assert {c["name"]: c["num_gpus"] for c in calls}["kaizen-learner"] == 0.2
    assert not any("scheduling_strategy" in c for c in calls)  # KubeRay: the state dir is a volume every pod mounts
    calls.clear()
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("Ctx", (), {"get_node_id": lambda self: "ab" * 28})())
    ray_local.start_actors(s)  # `up`: owned by its driver, as before, and kept on its node (its state dir is there)
    assert all(c["lifetime"] is None and not c["get_if_exists"] for c in calls)
    assert all(c["scheduling_strategy"].node_id == "ab" * 28 and not c["scheduling_strategy"].soft for c in calls)
