"""The gateway: bring your own agent. An OpenAI-compatible HTTP server beside the rollout
engine (``server``), one session per episode (``session``), the agent's side (``agent_task``:
what an agent function receives, and the thread that runs it; ``agent_command``: an agent
that is a command inside the task's sandbox, under the ``forwarder``), the Gymnasium env that
lets the rollout loop step an agent (``agent_env``), and the ``router`` that puts several
gateways behind one address. The pure parts: request checks and
response shapes (``protocol``), tool-call parsing (``tool_calls``), messages for the chat
template and the prefix test (``render``), and the error in OpenAI's schema (``errors``).

See docs/gateway.md.
"""

from agentrl.gateway.agent_command import AgentCommand
from agentrl.gateway.agent_env import AgentEnv, register_agent_env
from agentrl.gateway.agent_task import AgentTask
from agentrl.gateway.errors import GatewayError

__all__ = ["AgentCommand", "AgentEnv", "AgentTask", "GatewayError", "register_agent_env"]
