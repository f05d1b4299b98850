"""The supervisor gateway: ACP v1 and `_harness/*` over websockets (and stdio)."""

from supervision.gateway.auth import Token as Token
from supervision.gateway.server import Gateway as Gateway
from supervision.gateway.server import GatewayError as GatewayError
from supervision.gateway.server import GatewayStatistics as GatewayStatistics
from supervision.gateway.server import open_gateway as open_gateway
from supervision.gateway.server import serve_gateway as serve_gateway
from supervision.gateway.sessions import AgentProfile as AgentProfile
