import subprocess
import sys
from pathlib import Path

from config.settings import PRESETS, Settings, load_settings


def test_presets_validate_and_every_field_is_described():
    for name in ("cpu.yaml", "gpu.yaml"):
        load_settings(PRESETS / name)
    bench = sorted((Path(__file__).parents[1] / "benchmarks" / "configs").glob("*.yaml"))
    assert bench  # an hour runs on each: a misspelt setting would cost the hour, not a test
    for path in bench:
        load_settings(path)

    def walk(model):
        for fname, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, Settings.__mro__[1]):
                walk(ann)
            elif fname != "state_dir":
                assert f.description, f"{model.__name__}.{fname} has no description"

    walk(Settings)


def test_overrides():
    s = load_settings(None, **{"serve.port": 9123})
    assert s.serve.port == 9123 and s.model.engine == "transformers"


def test_open_conversations_must_fit_what_the_attributor_may_hold_unacked():
    import pytest

    with pytest.raises(ValueError, match="max_open x conversations.max_steps"):
        load_settings(None, **{"conversations.max_open": 200, "conversations.max_steps": 16})
    load_settings(None, **{"conversations.max_open": 200, "conversations.max_steps": 16, "conversations.enabled": False})


def test_cpu_path_never_imports_vllm():
    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.split('.')[0] == 'vllm': raise ImportError('vllm blocked')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "import policies.engines.engine, serve.app, actors.explorer, actors.learner, actors.broadcaster, main\n"
        "assert 'vllm' not in sys.modules\n"
    )
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
