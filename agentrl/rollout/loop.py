"""The multi-turn agent loop, over many episodes at once.

Continuous batching: every episode's next turn is queued in the engine as soon as its
environment step returns, while other episodes are still generating; environment steps
(sandbox commands, reward checks) run in a thread pool so the engine never waits on them.

Per-episode state (``RolloutLimits``, ``ActiveEpisode``) lives in ``agentrl.rollout.state``.
The episode state machine is stepped by ``agentrl.rollout.session.RolloutSession`` (``run``
is a thin loop over it; the streaming actor keeps one open and loads weights between engine
steps). Each sampled token is tagged with the weight version that sampled it
(``Turn.policy_versions``; a turn continued across a weight update spans two).

Per turn the loop records exactly what docs/design.md's ``Turn`` says. Termination:

Prompt modes: ``full_history`` appends each observation to the growing conversation
(delta tokenization); ``per_step`` rebuilds each turn's prompt from the task, the last
``history_length`` steps and the current observation, so each turn is its own training row.

Observations become chat messages of ``info["observation_role"]`` (``user`` by default);
with role ``tool``, each string in ``info["tool_outputs"]`` becomes its own tool message.

An env that speaks chat messages (the gateway's) gives ``StepInfo.messages`` instead
(``full_history`` only, else ``infra_error``): at reset the whole first prompt; at a step the
messages after the completion, delta-tokenized onto the branch the next turn extends
(``StepInfo.branch``), whose turns' ids alone are the engine prompt's prefix and the
context budget; a new branch (a fork) starts from the full rendering, with no prefix. The
other step-info keys and the ``set_rollout`` / ``receive_completion`` hooks:
docs/environments.md.

* the environment's ``terminated`` / ``truncated`` → ``env_terminated`` / ``env_truncated``;
* ``max_turns`` reached → truncated, ``max_turns``;
* a completion stopped by ``max_new_tokens`` → the episode ends there, truncated,
  ``length`` (docs/cases.md, C08a). With ``score_truncated`` (default) the cut answer is still
  handed to the environment, so a complete answer followed by cut-off chatter is scored;
  if the environment cannot parse it, the turn gets reward 0 and is *not* counted as an
  invalid action (a length stop is not a format failure). Without it, the action is not
  executed at all and earns 0;
* a completion stopped by the context budget (its ``max_tokens`` was the room left in
  ``max_context_tokens``, less than ``max_new_tokens``) → truncated, ``context_limit``; that
  turn's ``finish_reason`` is ``length``, as for ``max_new_tokens``: both are cut replies;
  except that a completion that reached its limit holding a stop string inside a JSON string
  of an open tool call (a missing closing quote) is cut at that string and ends as stopped,
  and its malformed call is scored as an invalid action (``agentrl.rollout.stop_strings``);
* the next observation leaves no room for a turn in ``max_context_tokens`` → truncated,
  ``context_limit``, and no engine call is made (docs/cases.md, C08b); every turn recorded was
  complete (none has ``finish_reason`` ``length``);
* an infrastructure fault (sandbox, env contract violation) → ``infra_error``; a reward
  function fault → ``reward_error``. Both keep the turns recorded so far, carry the error,
  and are excluded from the loss by the controller; never a reward of 0.
"""

from __future__ import annotations

import logging
import math
import traceback
from concurrent.futures import Future
from typing import Any, Callable, Protocol, Sequence

from agentrl.errors import ConfigError, EnvError, InfraError, RewardError
from agentrl.rollout.budget import RolloutBudget
from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.engine import Completion
from agentrl.rollout.judging import judge_metrics
from agentrl.rollout.session import RolloutSession
from agentrl.rollout.state import ActiveEpisode, RolloutLimits
from agentrl.rollout.stop_strings import cut_at_stop, cut_at_stop_in_string
from agentrl.types import Episode, EpisodeRequest, ExecResult, SamplingRecord, StepInfo, TerminationReason, Turn

log = logging.getLogger(__name__)


class EngineLike(Protocol):
    # with stop strings (rollout.stop_strings or a turn's StepInfo.stop_strings), ``add`` also
    # takes ``stop_strings`` and ``stop_context_ids`` (``RolloutWorker.stop_kwargs``; ``VLLMEngine.add``)
    def add(self, request_id: str, prompt_ids: Sequence[int], *, sampling: SamplingRecord, max_tokens: int,
            stop_token_ids: Sequence[int], seed: int | None = None) -> None: ...
    def has_unfinished(self) -> bool: ...
    def step(self) -> list[Completion]: ...
    def abort(self, request_ids: Any) -> None: ...
    def preempt(self, request_ids: Any) -> list[Completion]: ...  # weight loads in flight only (session)


EnvHandle = tuple[Any, Any]  # (gymnasium env, sandbox or None)
EnvFactory = Callable[[EpisodeRequest], EnvHandle]


def _check_step_output(out: Any, env_id: str) -> tuple[str, float, bool, bool, StepInfo]:
    """``env.step``'s 5-tuple, checked, with ``info`` parsed by ``StepInfo.from_info``.

    Raises:
        EnvError: wrong tuple shape, observation or flag types.
        RewardError: a reward that is not a finite number.
        StepInfoError (a ContractError): an ``info`` key of the wrong type.
    """
    if not isinstance(out, tuple) or len(out) != 5:
        raise EnvError(f"{env_id}.step returned {type(out).__name__} of length {len(out) if hasattr(out, '__len__') else '?'}; expected (observation, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, info = out
    if not isinstance(obs, str):
        raise EnvError(f"{env_id}.step returned observation of type {type(obs).__name__}; expected str")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(float(reward)):
        raise RewardError(f"{env_id}.step returned reward={reward!r}; expected a finite number")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise EnvError(f"{env_id}.step returned terminated={terminated!r}, truncated={truncated!r}; expected bools")
    return obs, float(reward), terminated, truncated, StepInfo.from_info(info, env_id=env_id, where="step")


def _observation_messages(obs: str, info: StepInfo) -> list[dict[str, str]]:
    """Chat messages for an observation: role ``info.observation_role``; with role ``tool``
    and ``info.tool_outputs`` (one string per tool call), one tool message per call, as
    chat templates expect after several calls, so turn-by-turn tokens equal the full
    rendering (docs/cases.md, C02)."""
    if info.observation_role == "tool" and info.tool_outputs:
        return [{"role": "tool", "content": o} for o in info.tool_outputs]
    return [{"role": info.observation_role, "content": obs}]


class RolloutWorker:
    """Runs episodes against one engine.

    Args:
        engine: a ``VLLMEngine`` (or anything with its ``add/step/has_unfinished/abort``).
        chat: delta tokenizer for the policy's chat template.
        env_factory: makes ``(env, sandbox)`` for a request; the worker closes both.
        limits: turn and token limits.
        sampling: the sampling transform (temperature, top_p, top_k).
        env_workers: threads for environment resets and steps.
        env_timeout_s: seconds one env call (a reset, with making the env and its sandbox,
            or a step) may run before its episode ends as ``infra_error``
            (``RolloutSession``); None: no limit.
        judge: the run's judge (``agentrl.rollout.judging``): each episode that ends
            without an error is judged, and handed back once its reward is settled; None:
            the environment's rule reward alone. A worker made by ``with_budget`` never has
            it: the training reward's judge never scores an eval.
        eval_judge: the eval's LLM judge (``eval.judge``), the judge of a worker made by
            ``with_budget`` for a budget whose ``judge`` is ``"eval"``; None: no eval judge.
    """

    def __init__(self, engine: EngineLike, chat: ChatTokenizer, env_factory: EnvFactory, limits: RolloutLimits,
                 sampling: SamplingRecord, env_workers: int = 8, env_timeout_s: float | None = None,
                 judge: Any = None, eval_judge: Any = None) -> None:
        self.engine = engine
        self.judge = judge  # the run's judge (agentrl.rollout.judging), or None: the env's rule reward alone
        self.eval_judge = eval_judge  # eval.judge's scorer, for eval budgets (with_budget), or None
        self.chat = chat
        self.env_factory = env_factory
        self.limits = limits
        self.sampling = sampling
        self.env_workers = env_workers
        if env_timeout_s is not None and not 0 < env_timeout_s <= 86_400:
            raise ConfigError(f"env_timeout_s={env_timeout_s!r}; expected seconds in (0, 86400] or None")
        self.env_timeout_s = env_timeout_s
        self.tokenizer = chat.tokenizer

    # ------------------------------------------------------------------------------
    def with_budget(self, budget: RolloutBudget) -> "RolloutWorker":
        """A worker on the same engine, chat template and env factory that rolls out under
        ``budget``: its turn and token limits and its sampling, and, when it carries
        ``env_kwargs``, environments made with them (the factory's ``with_env_kwargs``, e.g.
        ``agentrl.cluster.actors.env_factory.EnvFactory``). Its judge: this worker's
        ``eval_judge`` for a budget whose ``judge`` is ``"eval"``, else none (the env's rule; a
        difficulty profile's budget, for one). This worker is left as it is.

        Raises:
            ConfigError: ``budget.env_kwargs`` given to a factory without ``with_env_kwargs``;
                a budget with ``judge="eval"`` to a worker without an eval judge.
        """
        factory = self.env_factory
        if budget.env_kwargs is not None:
            with_kwargs = getattr(factory, "with_env_kwargs", None)
            if with_kwargs is None:
                raise ConfigError(f"a rollout budget with env_kwargs={dict(budget.env_kwargs)!r}, but the env factory "
                                  f"{factory!r} has no with_env_kwargs to make environments with them")
            factory = with_kwargs(budget.env_kwargs)
        if budget.judge == "eval" and self.eval_judge is None:
            raise ConfigError("a rollout budget with judge='eval', but this worker has no eval judge (eval.judge's "
                              "scorer, RolloutWorker(eval_judge=...))")
        return RolloutWorker(self.engine, self.chat, factory, budget.limits(self.limits), budget.sampling,
                             env_workers=self.env_workers, env_timeout_s=self.env_timeout_s,
                             judge=self.eval_judge if budget.judge == "eval" else None)

    def run(self, requests: Sequence[EpisodeRequest], policy_version: int,
            on_episode: Callable[[Episode], None] | None = None, budget: RolloutBudget | None = None) -> list[Episode]:
        """Roll out every request; returns episodes in request order. Never raises for one
        episode's fault: an exception from its env reset or step, from parsing its ``info``
        or from building its next prompt ends that episode alone with ``infra_error`` (or
        ``reward_error``), carrying the error's type, message and traceback. Each episode's
        id is its request's ``episode_id``. A thin loop over ``RolloutSession``
        (``agentrl.rollout.session``): submit everything, step until done.
        ``on_episode`` is called with each episode as it finishes (progress reports).
        ``budget``: this call's limits, sampling and env kwargs (``with_budget``); None: the
        worker's own.

        Raises:
            ContractError: two requests of the batch have the same ``episode_id``.
        """
        session = RolloutSession(self if budget is None else self.with_budget(budget), policy_version)
        done: dict[str, Episode] = {}
        try:
            session.submit(requests)
            while session.in_flight():
                for ep in session.step_once(wait_s=None):
                    done[ep.episode_id] = ep
                    if on_episode is not None:
                        on_episode(ep)
            session.wait_closed()
        except BaseException:
            session.abort_all()  # cancelled or crashed: abort engine requests and release every sandbox
            raise
        finally:
            session.shutdown()
        return [done[r.episode_id] for r in requests]

    # --- environment side (thread pool) ------------------------------------------------
    def _reset(self, st: ActiveEpisode) -> tuple[str, StepInfo]:
        env, sandbox = self.env_factory(st.req)
        st.env, st.sandbox = env, sandbox
        if sandbox is not None and hasattr(sandbox, "add_listener"):
            def listener(res: ExecResult, st: ActiveEpisode = st) -> None:
                with st.lock:
                    st.execs.append(res)
            st.listener = listener
            sandbox.add_listener(listener)
        configure = getattr(getattr(env, "unwrapped", env), "set_rollout", None)
        if callable(configure):  # an env that serves an agent (the gateway's) checks its calls against these
            configure(self.chat, self.sampling, self.limits.max_new_tokens, self.env_timeout_s)
        out = env.reset(seed=st.req.seed, options={"task_id": st.req.task_id})
        if not isinstance(out, tuple) or len(out) != 2:
            raise EnvError(f"{st.req.env_id}.reset returned {type(out).__name__}; expected (observation, info)")
        obs, info = out
        if not isinstance(obs, str):
            raise EnvError(f"{st.req.env_id}.reset returned observation of type {type(obs).__name__}; expected str")
        return obs, StepInfo.from_info(info, env_id=st.req.env_id, where="reset")

    def _step(self, st: ActiveEpisode) -> tuple[str, float, bool, bool, StepInfo]:
        """``env.step`` of the turn just sampled; before it, the env's
        ``unwrapped.receive_completion(turn, prompt_ids)`` when it has one (module docstring)."""
        turn = st.episode.turns[-1]
        hook = getattr(getattr(st.env, "unwrapped", st.env), "receive_completion", None)
        if callable(hook):
            hook(turn, list(st.engine_prompt))
        return _check_step_output(st.env.step(turn.action_text), st.req.env_id)

    def _close(self, st: ActiveEpisode) -> None:
        if st.sandbox is not None and st.listener is not None and hasattr(st.sandbox, "remove_listener"):
            try:
                st.sandbox.remove_listener(st.listener)  # a pooled sandbox serves other episodes next
            except Exception:
                log.exception("removing the exec listener of episode %s failed", st.episode.episode_id)
            st.listener = None
        for obj in (st.env, st.sandbox):
            if obj is None:
                continue
            try:
                obj.close()
            except Exception:
                log.exception("closing %s of episode %s failed", type(obj).__name__, st.episode.episode_id)
        st.env = st.sandbox = None

    # --- controller side (this thread) ------------------------------------------------
    def _fail(self, st: ActiveEpisode, reason: TerminationReason, exc: BaseException) -> bool:
        ep = st.episode
        ep.termination_reason = reason
        ep.terminated = False
        ep.truncated = False
        ep.error = {"type": type(exc).__name__, "message": str(exc)[:2000],
                    "traceback": "".join(traceback.format_exception(exc))[-4000:]}
        if ep.turns:
            with st.lock:
                ep.turns[-1].exec_results.extend(st.execs)
                st.execs.clear()
        return True

    def _finish(self, st: ActiveEpisode, reason: TerminationReason) -> bool:
        ep = st.episode
        ep.termination_reason = reason
        ep.terminated = reason == TerminationReason.ENV_TERMINATED
        ep.truncated = not ep.terminated
        return True

    def _queue_turn(self, st: ActiveEpisode, prompt: list[int], queue: list[ActiveEpisode], info: StepInfo,
                    branch: int = 0) -> bool:
        """Prepare the episode's next turn on ``branch`` (request id, engine prompt: the
        branch's ids so far, none in ``per_step`` mode, + ``prompt``; token budget and stop
        strings, with ``info``'s for this turn; seed) and put it on ``queue`` for the session
        (``_add_turn``). True when no turn fits the context (the episode ends, ``context_limit``)."""
        per_step = self.limits.prompt_mode == "per_step"
        prefix = [] if per_step else st.episode.token_ids(branch)
        room = self.limits.max_context_tokens - len(prefix) - len(prompt)
        if room < 1:
            return self._finish(st, TerminationReason.CONTEXT_LIMIT)
        st.branch = branch
        st.pending_prompt = prompt
        st.token_budget = min(self.limits.max_new_tokens, info.max_new_tokens or self.limits.max_new_tokens)
        st.max_tokens = min(st.token_budget, room)
        st.stop_strings = tuple(dict.fromkeys(self.limits.stop_strings + (info.stop_strings or ())))
        turn_idx = len(st.episode.turns)
        st.request_id = f"{st.episode.episode_id}:{turn_idx}"
        st.engine_prompt = prefix + prompt
        st.seed = st.req.sample_seed * 1009 + turn_idx
        st.segments = []
        st.preemptions = 0
        queue.append(st)
        return False

    def _add_turn(self, st: ActiveEpisode, version: int) -> None:
        """Add ``st``'s prepared turn to the engine, sampled under weight version ``version``."""
        st.version = version
        self.engine.add(st.request_id, st.engine_prompt, sampling=self.sampling, max_tokens=st.max_tokens,
                        stop_token_ids=self.chat.stop_token_ids, seed=st.seed, **self.stop_kwargs((), st.stop_strings))

    def stop_kwargs(self, sampled: Sequence[int] = (), stop_strings: Sequence[str] | None = None) -> dict[str, Any]:
        """``engine.add``'s stop-string arguments (none when no stop strings are set, so an
        engine without them keeps its signature): the stop strings (``stop_strings``: a
        turn's own, ``ActiveEpisode.stop_strings``; None: ``rollout.stop_strings``), and for a
        request that continues a preempted turn the turn's ids ``sampled`` so far
        (``stop_context_ids``), so a stop string inside a tool call's JSON string opened
        before the preemption does not end the turn (``agentrl.rollout.stop_strings``)."""
        stops = tuple(self.limits.stop_strings if stop_strings is None else stop_strings)
        if not stops:
            return {}
        kw: dict[str, Any] = {"stop_strings": stops}
        if sampled:
            kw["stop_context_ids"] = list(sampled)
        return kw

    def _after_env(self, kind: str, fut: Future, st: ActiveEpisode, queue: list[ActiveEpisode]) -> bool:
        try:
            result = fut.result()
        except RewardError as exc:
            return self._fail(st, TerminationReason.REWARD_ERROR, exc)
        except (InfraError, EnvError) as exc:
            return self._fail(st, TerminationReason.INFRA_ERROR, exc)
        except Exception as exc:  # an environment bug is not the model's fault either
            return self._fail(st, TerminationReason.INFRA_ERROR, exc)
        try:
            if kind == "reset":
                obs, info = result
                st.anchor = info.anchor_or(obs)
                st.task_text, st.system_prompt = obs, info.system_prompt
                st.reference_answer = info.reference_answer
                st.tools = [dict(t) for t in info.tools] if info.tools else None
                st.describes_tools = info.system_prompt_describes_tools
                st.examples = info.example_messages or ()
                self._refuse_in_per_step(st, info)
                _add_counters(st.episode, info)
                if info.messages is not None:  # the whole first prompt, template-ready
                    return self._queue_turn(st, self.chat.prompt_ids(list(info.messages), st.tools), queue, info)
                return self._queue_turn(st, self._first_prompt(st, obs), queue, info)
            obs, reward, terminated, truncated, info = result
            turn = st.episode.turns[-1]
            turn.reward = reward
            turn.observation_text = obs
            turn.invalid_action = info.invalid_action
            if info.success is not None:
                st.episode.success = info.success
            if info.tool_calls is not None:
                turn.tool_calls = info.tool_calls
            st.final_answer = info.final_answer  # the last step's (a judge reads the episode's final answer)
            _add_counters(st.episode, info)
            self._refuse_in_per_step(st, info)
            with st.lock:
                turn.exec_results.extend(st.execs)
                st.execs.clear()
            if turn.finish_reason == "length" and not st.own_cap:
                # A cut answer was scored for what it holds, but its format is never
                # penalised (docs/cases.md, C08a): an unparseable cut answer earns 0, not a penalty.
                if turn.invalid_action:
                    turn.invalid_action = False
                    turn.reward = 0.0
                return self._finish(st, st.length_reason)
            if terminated:
                return self._finish(st, TerminationReason.ENV_TERMINATED)
            if truncated:
                return self._finish(st, TerminationReason.ENV_TRUNCATED)
            if len(st.episode.turns) >= self.limits.max_turns:
                return self._finish(st, TerminationReason.MAX_TURNS)
            st.anchor = info.anchor_or(obs)
            if self.limits.prompt_mode == "per_step":
                return self._queue_turn(st, self._first_prompt(st, self._step_prompt_text(st)), queue, info)
            branch = turn.branch if info.branch is None else info.branch
            return self._queue_turn(st, self._next_prompt(st, obs, info, branch), queue, info, branch)
        except RewardError as exc:
            return self._fail(st, TerminationReason.REWARD_ERROR, exc)
        except Exception as exc:
            # Building the next prompt from what this env returned (tool schemas, chat
            # template, token budget) failed: that episode ends as infra_error with the
            # message; the other episodes of the batch go on.
            return self._fail(st, TerminationReason.INFRA_ERROR, exc)

    def _refuse_in_per_step(self, st: ActiveEpisode, info: StepInfo) -> None:
        """Raise ``EnvError`` in ``per_step`` mode when the env sends chat messages or a branch > 0."""
        if self.limits.prompt_mode == "per_step" and (info.messages is not None or info.branch):
            key = "messages" if info.messages is not None else "branch"
            raise EnvError(f"{st.req.env_id} sent info[{key!r}] but rollout.prompt_mode is per_step, which rebuilds "
                           "each prompt from the env's observation text; an agent that sends chat messages (or "
                           "forks) needs rollout.prompt_mode: full_history")

    def _next_prompt(self, st: ActiveEpisode, obs: str, info: StepInfo, branch: int) -> list[int]:
        """The next turn's prompt ids on ``branch``: the delta of ``info.messages`` (else the
        observation's) after that branch's last completion; for a new branch (a fork) the full
        rendering of ``info.messages`` (``EnvError`` without them)."""
        on_branch = st.episode.branch_turns(branch)
        if not on_branch:
            if info.messages is None:
                raise EnvError(f"{st.req.env_id} step: info['branch']={branch} starts a new branch but gives no "
                               "info['messages']; a new branch's first prompt is the full rendering of its messages")
            return self.chat.prompt_ids(list(info.messages), list(info.tools) if info.tools is not None else st.tools)
        last = st.episode.turns[on_branch[-1]]
        ended_with_stop_token = bool(last.completion_ids) and last.completion_ids[-1] in self.chat.stop_token_ids
        msgs = list(info.messages) if info.messages is not None else _observation_messages(obs, info)
        return self.chat.delta_ids(msgs, completion_ended_with_stop=ended_with_stop_token)

    def _first_prompt(self, st: ActiveEpisode, user_text: str) -> list[int]:
        msgs = self.chat.initial_messages(st.system_prompt, user_text, st.tools, prompt_describes_tools=st.describes_tools,
                                          examples=st.examples)
        return self.chat.prompt_ids(msgs, st.tools)

    def _step_prompt_text(self, st: ActiveEpisode) -> str:
        """Per-step prompt (verl-agent's memory-based prompting): the task, the last
        ``history_length`` steps (action and observation), and the current observation."""
        turns = st.episode.turns
        h = self.limits.history_length
        shown = turns[-h - 1:-1] if h > 0 else []
        first = len(turns) - 1 - len(shown)
        parts = [st.task_text]
        if shown:
            parts.append(f"Your previous {len(shown)} step(s), oldest first:")
            for i, t in enumerate(shown, start=first + 1):
                parts.append(f"Step {i} action:\n{t.action_text}\nStep {i} observation:\n{t.observation_text}")
        parts.append(f"Step {len(turns)} action:\n{turns[-1].action_text}")
        parts.append(f"Current observation (after step {len(turns)}):\n{turns[-1].observation_text}")
        return "\n\n".join(parts)

    def _after_completion(self, comp: Completion, st: ActiveEpisode) -> bool:
        """Record the finished turn: its segments before any preemption, then ``comp``
        (sampled under ``st.version``), each token tagged with the version that sampled it."""
        ids = [t for seg in st.segments for t in seg[0]] + list(comp.token_ids)
        lps = [lp for seg in st.segments for lp in seg[1]] + list(comp.log_probs)
        versions = [seg[2] for seg in st.segments for _ in seg[0]] + [st.version] * len(comp.token_ids)
        st.segments = []
        if st.stop_strings and comp.finish_reason != "abort":
            # the engine stops at a stop string within its steps; here the whole turn is cut
            # again (an engine that ignores stop strings, one spanning a preemption), by the
            # same rule (agentrl.rollout.stop_strings: the closing tag where it closes a call)
            k = cut_at_stop(ids, self.tokenizer.decode, st.stop_strings)
            if k is None and comp.finish_reason == "length":
                # ran to its token limit with a stop string inside a call's JSON string: most
                # likely a call with a missing closing quote; it ends there as stopped, so the
                # call is parsed and scored invalid instead of running into imagined output
                k = cut_at_stop_in_string(ids, self.tokenizer.decode, st.stop_strings)
            if k is not None and not (k == len(ids) - 1 and ids[-1] in self.chat.stop_token_ids):
                ids, lps, versions = ids[:k], lps[:k], versions[:k]
                comp = Completion(comp.request_id, tuple(ids), tuple(lps), "stop", None)
        turn = Turn(
            prompt_ids=st.pending_prompt,
            completion_ids=ids,
            behavior_log_probs=lps,
            sampling=self.sampling,
            policy_version=versions[0] if versions else st.version,
            finish_reason=comp.finish_reason,
            anchor=st.anchor,
            action_text=self.tokenizer.decode(ids, skip_special_tokens=True),
            policy_versions=versions,
            branch=st.branch,
        )
        st.episode.turns.append(turn)
        st.pending_prompt = []
        if comp.finish_reason == "abort":
            return self._fail(st, TerminationReason.INFRA_ERROR, InfraError("the engine aborted the request"))
        st.own_cap = False
        if comp.finish_reason == "length":
            cut_by_context = st.max_tokens < st.token_budget
            if not cut_by_context and st.token_budget < self.limits.max_new_tokens:
                # cut by the cap the env asked for this turn (StepInfo.max_new_tokens, e.g. an
                # agent's max_tokens): a short answer it wanted, not the run's budget running out
                st.own_cap = True
                return False
            st.length_reason = TerminationReason.CONTEXT_LIMIT if cut_by_context else TerminationReason.LENGTH
            if not self.limits.score_truncated:
                turn.reward = 0.0  # not handed to the environment; not a format failure (docs/cases.md, C08a)
                return self._finish(st, st.length_reason)
        return False


def _add_counters(episode: Episode, info: StepInfo) -> None:
    for key, value in (info.counters or {}).items():
        episode.counters[key] = episode.counters.get(key, 0.0) + float(value)


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Per-iteration rollout metrics with fixed names (``rollout/...``; docs/metrics.md),
    and each key of the episodes' ``Episode.counters`` summed over the episodes under its
    own name (e.g. ``gateway/forks``)."""
    n = len(episodes)
    valid = [e for e in episodes if not e.is_error]
    rewards = [e.total_reward for e in valid if e.total_reward is not None]
    # an aborted attempt (its engine was lost) has no turns and was rolled out again: it is not
    # an episode of the policy's, so it never pulls the per-episode means down
    turns = [len(e.turns) for e in episodes if e.termination_reason != TerminationReason.ABORTED]
    resp = [len(t.completion_ids) for e in episodes for t in e.turns]
    successes = sum(1 for e in valid if (e.success if e.success is not None else (e.total_reward or 0.0) >= 1.0))
    m: dict[str, float] = {
        "rollout/episodes": float(n),
        "rollout/scored_episodes": float(len(valid)),  # the denominator of success_rate and reward_mean
        "rollout/successes": float(successes),
        "rollout/reward_mean": float(sum(rewards) / len(rewards)) if rewards else float("nan"),
        "rollout/success_rate": float(successes / len(valid)) if valid else float("nan"),
        "rollout/turns_mean": float(sum(turns) / len(turns)) if turns else 0.0,
        "rollout/response_length_mean": float(sum(resp) / len(resp)) if resp else 0.0,
        "rollout/response_length_max": float(max(resp)) if resp else 0.0,
        "rollout/generated_tokens": float(sum(e.num_generated_tokens() for e in episodes)),
        "rollout/invalid_action_rate": float(sum(t.invalid_action for e in episodes for t in e.turns) / max(1, len(resp))),
        "rollout/sandbox_execs": float(sum(len(t.exec_results) for e in episodes for t in e.turns)),
        # lost with their engine (flagged, never scored; their requests were rolled out again)
        "rollout/aborted_episodes": float(sum(1 for e in episodes if e.termination_reason == TerminationReason.ABORTED)),
        "rollout/tool_calls": float(sum(t.tool_calls for e in episodes for t in e.turns)),
        "rollout/episodes_without_tool_calls": float(sum(1 for e in valid if not any(t.tool_calls for t in e.turns))),
    }
    for reason in TerminationReason:
        m[f"rollout/termination/{reason.value}"] = float(sum(1 for e in episodes if e.termination_reason == reason))
    for fr in ("stop", "length", "abort"):
        m[f"rollout/finish_reason/{fr}"] = float(sum(1 for e in episodes for t in e.turns if t.finish_reason == fr))
    m.update(judge_metrics(list(episodes)))
    fixed = set(m)  # StepInfo keeps counters out of rollout/; a hand-built one never overwrites these
    for key, value in ((k, v) for e in episodes for k, v in e.counters.items() if k not in fixed):
        m[key] = m.get(key, 0.0) + float(value)
    return m

