"""Agents: the actor per session, its inbox, the turn/step loop and tools."""

from actors.agent.agent import Agent as Agent
from actors.agent.agent import AgentStatistics as AgentStatistics
from actors.agent.agent import InboxFullError as InboxFullError
from actors.agent.agent import TaskSpawner as TaskSpawner
from actors.agent.agent import open_agent as open_agent
from actors.agent.agent import start_hosted_agent as start_hosted_agent
from actors.agent.decisions import Enter as Enter
from actors.agent.decisions import Reject as Reject
from actors.agent.decisions import Retry as Retry
from actors.agent.decisions import StepProposal as StepProposal
from actors.agent.function_tool import function_tool as function_tool
from actors.agent.inspect import StepInspection as StepInspection
from actors.agent.options import AgentOptions as AgentOptions
from actors.agent.options import RetryPolicy as RetryPolicy
from actors.agent.result import AgentClosedError as AgentClosedError
from actors.agent.result import TurnFailedError as TurnFailedError
from actors.agent.result import TurnResult as TurnResult
from actors.agent.result import TurnTicket as TurnTicket
from actors.agent.tool_call import IdempotencyKey as IdempotencyKey
from actors.agent.tool_call import ToolInvocation as ToolInvocation
from actors.agent.tools import Tool as Tool
from actors.agent.tools import ToolRegistry as ToolRegistry
from actors.agent.validation import InvalidArguments as InvalidArguments
from actors.agent.validation import ToolSchemaError as ToolSchemaError
