"""Providers: the protocol, the scripted provider, the OpenAI-compatible adapter, the simulator."""

from actors.providers.base import Provider as Provider
from actors.providers.base import ProviderError as ProviderError
from actors.providers.chunks import Chunk as Chunk
from actors.providers.chunks import Failure as Failure
from actors.providers.chunks import FinishChunk as FinishChunk
from actors.providers.chunks import ReasoningDelta as ReasoningDelta
from actors.providers.chunks import TextDelta as TextDelta
from actors.providers.chunks import ToolCallDelta as ToolCallDelta
from actors.providers.chunks import Usage as Usage
from actors.providers.chunks import UsageChunk as UsageChunk
from actors.providers.request import GenerateRequest as GenerateRequest
from actors.providers.scripted import Reply as Reply
from actors.providers.scripted import ScriptedProvider as ScriptedProvider
from actors.providers.scripted import ToolCall as ToolCall
