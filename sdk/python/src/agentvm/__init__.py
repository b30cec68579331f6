"""agentvm: durable, forkable Linux VMs for AI agents.

``AgentVM`` is the sync client, ``AsyncAgentVM`` the async one; both take
the server from AGENTVM_URL and the token from AGENTVM_TOKEN (else the
admin token in the data dir), as the CLI does. The OpenAI Agents SDK
sandbox provider is ``agentvm.openai_agents`` (pip install 'agentvm-sdk[agents]').
"""

from . import models
from ._streams import ByteStream, LineStream
from .client import AgentVM, AsyncAgentVM, Networks, Nodes, Snapshots, Tokens, VMs
from .errors import (
    AgentVMError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InsufficientStorage,
    InternalError,
    InvalidArgument,
    NotFound,
    StreamLost,
    TooManyRequests,
    Unauthorized,
    Unavailable,
)
from .exec import AsyncConnection, AsyncProcess, Connection, Process, RunResult
from .resources import Execution
from .terminals import AsyncTerminal, Terminal
from .vm import VM, ForkResult

__version__ = "0.1.0"

__all__ = [
    "VM",
    "AgentVM",
    "AgentVMError",
    "AsyncAgentVM",
    "AsyncConnection",
    "AsyncProcess",
    "AsyncTerminal",
    "ByteStream",
    "Conflict",
    "Connection",
    "ConnectionFailed",
    "Execution",
    "Forbidden",
    "ForkResult",
    "InsufficientStorage",
    "InternalError",
    "InvalidArgument",
    "LineStream",
    "Networks",
    "Nodes",
    "NotFound",
    "Process",
    "RunResult",
    "Snapshots",
    "StreamLost",
    "Terminal",
    "Tokens",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "VMs",
    "models",
]
