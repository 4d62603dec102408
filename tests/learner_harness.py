"""A real learner and trainer on a tiny model for the learner's unit tests, without `start`: the bus and the messages
are doubles that record what happens to them. tests/ is on sys.path (its conftest.py)."""


class Bus:
    def __init__(self):
        self.events = []

    async def publish(self, event, **_):
        self.events.append(event)


class Msg:
    def __init__(self):
        self.acks, self.headers = 0, None

    async def ack_sync(self):
        self.acks += 1

    async def in_progress(self):
        pass


def make_learner(tmp_path, tiny_dir, **learner):
    from actors.learner import Learner
    from config.settings import load_settings
    from policies.engines.live_policy import LivePolicy
    from policies.learning.checkpoint import CheckpointStore
    from policies.learning.staleness import WaitForUsers
    from policies.learning.step_size import StepSize
    from policies.learning.trainer import Trainer
    from policies.weights.model_store import BASE_VERSION

    pinned = {"groups_per_step": 1, "replay_groups": 0, "lr": 1e-3, **learner}  # not the preset's
    s = load_settings(None, **{f"learner.{k}": v for k, v in pinned.items()})
    s.state_dir = str(tmp_path / "state")
    s.model.serve_dtype = "float32"
    ln = Learner(s, bus=Bus())
    ln.policy = LivePolicy(s, base=tiny_dir)
    ln.base, ln.store = tiny_dir, ln.policy.store
    ln.ckpts = CheckpointStore(s.state / "learner")
    ln.trainer, ln.parent = Trainer(s, tiny_dir, ln.store), BASE_VERSION
    ln.weights_version, ln.wait = BASE_VERSION, WaitForUsers.from_settings(s.learner)
    ln.step_size = StepSize.from_settings(s.learner)
    ln.ready, ln.live, ln.replay, ln.held = [], {}, [], {}
    ln._last_beat, ln.steps_done, ln.dropped_stale, ln.dropped_stale_live = 0.0, 0, 0, 0
    ln.groups_seen = ln.groups_own_signal = ln.groups_no_signal = 0
    return ln
