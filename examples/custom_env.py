"""A new environment, registered, checked and trained for one iteration:
``.venv/bin/python examples/custom_env.py [run_dir]``. ``env.import_modules`` makes every
Ray actor import this file as ``custom_env`` (Ray puts the script's folder on the actors'
sys.path), so they register the same env."""
import sys
import time

import gymnasium

import agentrl
from agentrl.errors import EnvError
from environments.core import TextSpace

ENV_ID = "example/Add-v0"


class AddEnv(gymnasium.Env):
    """Add two numbers; reward 1.0 for the right sum. One turn per episode."""

    uses_sandbox = False  # runs no commands: the rollout starts no sandbox for it
    observation_space = TextSpace(max_length=200)  # the question, then "Correct." / "Wrong."
    action_space = TextSpace()  # the model's reply, any text

    def __init__(self):
        self._answer = None

    @classmethod
    def task_ids(cls, split="train"):
        return [f"add/{i}" for i in (range(0, 100) if split == "train" else range(100, 120))]

    @classmethod
    def checker_actions(cls):
        return ["I think it is 5."]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        i = int(((options or {}).get("task_id") or "add/0").split("/")[1])
        a, b = i % 10, i // 10 + 3
        self._answer = a + b
        return f"What is {a} + {b}? Reply with the number only.", {"anchor": (a, b)}

    def step(self, action):
        if self._answer is None:
            raise EnvError("AddEnv.step() after the episode ended; call reset()")
        reward, self._answer = float(action.strip() == str(self._answer)), None
        return "Correct." if reward else "Wrong.", reward, True, False, {"anchor": "done"}


agentrl.register_env(ENV_ID, "custom_env:AddEnv")

if __name__ == "__main__":
    from environments.checker import check_env, format_report

    report = check_env(ENV_ID)
    print(format_report(report))
    report.raise_if_failed()
    # A fresh run directory each time (pass one to choose it; --resume is for continuing a run).
    run_dir = sys.argv[1] if len(sys.argv) > 1 else f"runs/custom-env-example-{time.strftime('%Y%m%d-%H%M%S')}"
    # code_defaults: the config classes' own defaults (agentrl.default_config is the ShellLookup run)
    cfg = agentrl.code_defaults([f"env.id={ENV_ID}", "env.import_modules=[custom_env]", "model.path=tiny-random-smollm2",
                                 "run.iterations=1", f"run.dir={run_dir}", "run.name=custom-env",
                                 "env.tasks_per_iteration=2", "env.group_size=2", "rollout.max_turns=1",
                                 "rollout.max_new_tokens=8"])
    print(agentrl.train(cfg))
