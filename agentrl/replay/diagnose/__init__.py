"""``agentrl diagnose``: the symptom table checked against one run's own data.

    db = ReadOnlyDB(url)                   # agentrl.replay.read; or a ReplayStore
    d = diagnose(db, run_id)               # Diagnosis: findings, task classes
    d.fired()                              # the checks that fire
    d.to_json()                            # the --json form

The checks (``agentrl.replay.diagnose.checks``) are pure functions of ``RunData``
(``agentrl.replay.diagnose.data.load_run``), so the viewer's ``/diagnose?run=RUN`` page and the
terminal report show the same thing. The judge checks (``agentrl.replay.diagnose.judge``)
read the stored judgements of the run's training episodes: ``d.judge``.
"""

from agentrl.replay.diagnose.answers import last_boxed, normalize_answer
from agentrl.replay.diagnose.checks import CHECKS, Finding
from agentrl.replay.diagnose.data import JudgeFacts, RunData, load_run
from agentrl.replay.diagnose.judge import JUDGE_CHECKS, judge_findings
from agentrl.replay.diagnose.report import Diagnosis, diagnose, diagnose_data, episode_link, print_report
from agentrl.replay.diagnose.tasks import TaskVerdict, classify_tasks

__all__ = ["CHECKS", "JUDGE_CHECKS", "Diagnosis", "Finding", "JudgeFacts", "RunData", "TaskVerdict", "classify_tasks",
           "diagnose", "diagnose_data", "episode_link", "judge_findings", "last_boxed", "load_run", "normalize_answer", "print_report"]
