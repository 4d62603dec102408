"""The configured environments by name (`env.names` in the settings)."""

from __future__ import annotations

from envs.base import Environment

# environments whose episode is one call a client forced, checked against a reference (BFCL's AST checker): there a
# call that fits the declared tools has what every accepted call has (`rollout.fit_credit`)
ONE_CALL = ("bfcl_single", "client_tools")


def make_env(name: str, env_settings) -> Environment:
    if name == "bfcl":
        from envs.bfcl import BfclEnvironment

        return BfclEnvironment.from_settings(env_settings)
    if name == "code":
        from envs.code import CodeEnvironment

        return CodeEnvironment.from_settings(env_settings)
    if name == "bfcl_single":
        from envs.bfcl_single import SingleTurnEnvironment

        return SingleTurnEnvironment.from_settings(env_settings)
    raise KeyError(f"unknown environment {name!r}; known: bfcl, bfcl_single, code")


def make_envs(env_settings) -> dict[str, Environment]:
    return {n: make_env(n, env_settings) for n in env_settings.names}
