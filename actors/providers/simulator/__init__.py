"""A local, deterministic, DeepSeek-compatible chat-completions server.

For tests (behind `httpx.MockTransport`), the demo and benchmarks (on a loopback port).
"""

from actors.providers.simulator.asgi import SimulatorApp as SimulatorApp
from actors.providers.simulator.cache import CacheStatistics as CacheStatistics
from actors.providers.simulator.cache import PrefixCache as PrefixCache
from actors.providers.simulator.config import Profile as Profile
from actors.providers.simulator.config import SimulatorConfig as SimulatorConfig
from actors.providers.simulator.engine import RecordedRequest as RecordedRequest
from actors.providers.simulator.engine import SimulatorEngine as SimulatorEngine
from actors.providers.simulator.engine import SimulatorStatistics as SimulatorStatistics
from actors.providers.simulator.exchange import ConnectionReset as ConnectionReset
from actors.providers.simulator.exchange import SimRequest as SimRequest
from actors.providers.simulator.exchange import SimResponse as SimResponse
from actors.providers.simulator.exchange import SimStream as SimStream
from actors.providers.simulator.faults import FAULT_HEADER as FAULT_HEADER
from actors.providers.simulator.faults import Fault as Fault
from actors.providers.simulator.faults import FaultError as FaultError
from actors.providers.simulator.faults import FaultPlan as FaultPlan
from actors.providers.simulator.model import ReplyScript as ReplyScript
from actors.providers.simulator.model import SimReply as SimReply
from actors.providers.simulator.model import SimToolCall as SimToolCall
from actors.providers.simulator.script import ModelScript as ModelScript
from actors.providers.simulator.script import ScriptError as ScriptError
from actors.providers.simulator.script import ScriptRule as ScriptRule
from actors.providers.simulator.server import run_simulator_cli as run_simulator_cli
from actors.providers.simulator.server import serve_simulator as serve_simulator
from actors.providers.simulator.tokens import tokenize as tokenize
from actors.providers.simulator.transport import simulator_transport as simulator_transport
