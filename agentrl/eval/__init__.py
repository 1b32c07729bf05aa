"""Held-out evaluation (issue 14): the pass@k math and report (``agentrl.eval.passk``).
The run that produces the episodes is wiring and lives in ``agentrl.cluster.evaluate``."""
