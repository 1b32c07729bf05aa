"""The ``agentrl.estimators`` entry-point group: loaded under the registry lock (a lookup
from another thread waits for it), and a broken entry point named, with its error, in the
unknown-estimator message. The distributions are written under tmp_path and put on
sys.path (no pip install)."""

from __future__ import annotations

import sys
import threading

import pytest

from agentrl.errors import ConfigError
from critics import registry


def _dist(root, dist, module, source, entry):
    (root / f"{module}.py").write_text(source)
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{entry}\n")


@pytest.fixture
def fresh_entry_points(tmp_path, monkeypatch):
    """A registry that has not loaded entry points yet; the estimators and modules the
    test adds are removed afterwards."""
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(registry, "_entry_point_failures", {})
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(registry.ESTIMATORS)
    yield tmp_path
    for name in set(registry.ESTIMATORS) - before:
        registry.ESTIMATORS.pop(name)
    for mod in ("slow_eps_mod", "broken_eps_mod"):
        sys.modules.pop(mod, None)


def test_a_lookup_during_loading_waits_for_it(fresh_entry_points):
    _dist(fresh_entry_points, "slow-eps", "slow_eps_mod",
          "import threading, time\n"
          "import critics\n"
          "STARTED = threading.Event()\n"
          "def register():\n"
          "    STARTED.set()\n"
          "    time.sleep(0.3)\n"
          "    critics.register_estimator('test_slow_ep', lambda r, a, g, v, p: [[0.0] * len(x) for x in r])\n",
          "slow = slow_eps_mod:register")
    import slow_eps_mod

    loader = threading.Thread(target=registry.load_entry_points)
    loader.start()
    try:
        assert slow_eps_mod.STARTED.wait(10)  # the loader is inside the entry point now
        assert registry.get_estimator("test_slow_ep").level == "turn"  # not "unknown estimator"
    finally:
        loader.join(10)
    assert registry._entry_points_loaded and registry._entry_point_failures == {}


def test_a_broken_entry_point_is_named_in_the_unknown_estimator_error(fresh_entry_points):
    _dist(fresh_entry_points, "broken-eps", "broken_eps_mod",
          "def register():\n    raise RuntimeError('boom in register')\n", "my_adv = broken_eps_mod:register")
    registry.load_entry_points()  # logged and skipped: the built-ins still work
    assert registry.get_estimator("grpo").name == "grpo"
    with pytest.raises(ConfigError, match=r"unknown advantage estimator 'my_adv'.*entry point 'my_adv' of "
                                          r"'agentrl.estimators' failed to load \(broken_eps_mod:register: "
                                          r"RuntimeError: boom in register\)"):
        registry.get_estimator("my_adv")


def test_an_entry_point_that_looks_an_estimator_up_while_loading_does_not_recurse(fresh_entry_points):
    _dist(fresh_entry_points, "slow-eps", "slow_eps_mod",
          "import critics\n"
          "def register():\n"
          "    assert critics.get_estimator('grpo').name == 'grpo'  # re-enters load_entry_points\n"
          "    critics.register_estimator('test_reentrant', lambda *a: None)\n",
          "slow = slow_eps_mod:register")
    assert registry.get_estimator("test_reentrant").name == "test_reentrant"
    assert registry._entry_point_failures == {}
