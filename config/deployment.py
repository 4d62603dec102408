"""Where and how the system runs: the NATS server and stream, the Ray cluster, the serving replicas, and where weights
versions travel between nodes; sections of `config.settings.Settings`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from config.checks import _Section


class NatsSettings(_Section):
    url: str | None = Field(None, description="External NATS URL; when unset `up` starts an embedded nats-server")
    port: int = Field(0, description="Port for the embedded nats-server; 0 picks a free loopback port")
    host: str = Field(
        "127.0.0.1",
        description="Address the embedded nats-server listens on: loopback, unless other "
        "hosts join this one (`main.py join`) and must reach it",
    )
    user: str = Field("kaizen", description="NATS user name for the embedded server")
    password: str | None = Field(None, description="NATS password; generated into the state dir when unset")
    stream: str = Field("EVO", description="JetStream stream that holds every evo.* event")
    subject_prefix: str = Field("evo", description="Subject prefix of the evolution events")
    max_deliver: int = Field(5, description="Deliveries of one event before it is dead-lettered")
    ack_wait_s: float = Field(
        60.0,
        description="Seconds before an event a crashed actor held is redelivered "
        "(long work sends in-progress heartbeats; set when the durable consumer is created)",
    )
    dedup_window_s: float = Field(120.0, description="JetStream duplicate window for Nats-Msg-Id")
    max_age_days: float = Field(
        30.0,
        description="Events older than this leave the stream (0 = kept forever); the "
        "navigator's memory survives through its snapshot, see README 'Retention'",
    )
    max_bytes: int = Field(2 * 1024**3, description="Stream size limit; the oldest events go first (-1 = none)")
    replicas: int = Field(
        1,
        ge=1,
        le=5,
        description="JetStream replicas of the stream and of the buckets beside it "
        "(the live pointer's key-value bucket, the weights object store): a NATS cluster of that "
        "many servers keeps them through a server's loss",
    )


class RaySettings(_Section):
    address: str | None = Field(None, description="Existing Ray cluster address; local Ray when unset")
    node_ip: str | None = Field(
        None,
        description="This host's address for the local Ray head when other hosts join it "
        "(`main.py join`): Ray listens there; loopback when unset",
    )
    num_cpus: float = Field(8, description="Logical CPUs declared to local Ray (actors take fractions)")
    actor_cpus: float = Field(0.5, description="Logical CPUs reserved by each evolution actor")
    actor_gpus: dict[str, float] = Field({}, description="GPUs per evolution actor by name, e.g. {learner: 0.3}")
    actor_nice: dict[str, int] = Field(
        {"explorer": 10, "questioner": 15, "attributor": 10, "learner": 5, "broadcaster": 5},
        description="OS niceness added to an actor's process. Users first: the serving "
        "replicas and the navigator (memory for live requests) keep 0, so the loop "
        "runs on what users leave; within the loop, the path from an interaction to "
        "served weights goes first (learner, gate: 5; judge and the explorer, which re-samples "
        "live steps ahead of tasks: 10), then task writing (15)",
    )


class ServeSettings(_Section):
    host: str = Field("127.0.0.1", description="HTTP bind address of the Serve proxy")
    port: int = Field(8000, description="HTTP port of the Serve proxy")
    replicas: int = Field(1, description="Number of serving replicas")
    replica_cpus: float = Field(1.0, description="Logical CPUs per serving replica")
    replica_gpus: float = Field(0.0, description="GPUs per serving replica (a fraction shares one GPU)")
    max_replicas_per_node: int = Field(
        0,
        ge=0,
        le=100,
        description="At most this many replicas on one Ray node "
        "(0: no limit); 1 spreads the replicas over the hosts that joined (`up` is "
        "ready once each replica has a node)",
    )
    api_key: str | None = Field(None, description="Bearer key; generated into the state dir (0600) when unset")
    user_keys_file: str | None = Field(
        None,
        description="Per-user bearer keys, one `name key` a line (`#` comments; keys of 16+ characters), read when serve "
        "starts: a request with one is that named user to the per-user caps, conversation stitching and provenance, "
        "whatever its `user` field says; the deployment key's clients name their users by `user`. These keys reach "
        "chat, feedback and the model list; /metrics and the page take the deployment key alone",
    )
    max_body_bytes: int = Field(1_000_000, description="Largest accepted request body")
    max_new_tokens: int = Field(256, description="Cap on generated tokens per request (a larger max_tokens is clamped to it)")
    model_aliases: list[str] = Field(
        [],
        description="Other model names requests may use for the served model (an "
        "unknown name is a 404 model_not_found, as the reference answers)",
    )
    max_batch: int = Field(8, description="Concurrent requests a replica's transformers engine answers in one batch")
    batch_window_ms: float = Field(50.0, description="How long a batch that is not full waits for more requests")
    max_ongoing_requests: int = Field(16, description="Requests a replica takes at once; Serve queues the rest")
    max_prompt_tokens: int = Field(3072, description="Longest accepted prompt, in tokens")
    retrieve_timeout_s: float = Field(0.5, description="How long a request waits for memory retrieval")
    experiences_k: int = Field(2, description="Experiences put into the live agent's context")
    weights_transport: Literal["file", "shared"] = Field(
        "file",
        description="How a swap reaches the replicas: file (the verified safetensors file, read by every "
        "replica) or shared (the gate engine's weights in place: CUDA IPC on a GPU, shared memory on a CPU; the "
        "file when the gate engine holds another version or its weights change during the copy)",
    )


class WeightsSettings(_Section):
    store: Literal["state_dir", "nats"] = Field(
        "state_dir",
        description="Where weights versions travel between nodes: state_dir (the files in the state dir; "
        "one host, or a state dir every node mounts) or nats (each saved version is also put into a JetStream object "
        "store, and a node whose state dir lacks a version fetches it once, checks its sha256, then loads it)",
    )
    transfer_timeout_s: float = Field(
        3600.0, description="Longest upload or fetch of one version's file (a 7B version is ~15 GB)"
    )
