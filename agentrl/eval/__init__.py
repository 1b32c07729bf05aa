"""Held-out evaluation: the pass@k math and report (``agentrl.eval.passk``).
The run that produces the episodes is wiring and lives in ``agentrl.commands.evaluate``."""
