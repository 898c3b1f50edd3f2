"""rllm.types: the data model shared by every rLLM package (msgspec Structs, no other deps)."""

from rllm.types.arrays import Advantage, FloatArray, TokenArray, as_float_array, as_token_array
from rllm.types.codec import convert, from_json, from_msgpack, to_builtins, to_json, to_msgpack
from rllm.types.episode import (
    Episode,
    ErrorInfo,
    Step,
    TerminationReason,
    Trajectory,
    TrajectoryGroup,
    new_id,
)
from rllm.types.errors import ConfigError, InvariantError, RLLMError, SchemaError
from rllm.types.messages import (
    ContentBlock,
    FunctionCall,
    ImageBlock,
    ImageURL,
    Message,
    TextBlock,
    ToolCall,
)
from rllm.types.sequence import TrainSequence
from rllm.types.task import (
    GRADER_ONLY_KEY,
    GRADER_ONLY_METADATA,
    AgentConfig,
    EvalOutput,
    SamplingParams,
    Signal,
    Task,
    agent_view,
    grader_only_keys,
)
from rllm.types.trace import TraceRecord, Usage
from rllm.types.version import SCHEMA_VERSION

__all__ = [
    "GRADER_ONLY_KEY",
    "GRADER_ONLY_METADATA",
    "SCHEMA_VERSION",
    "Advantage",
    "AgentConfig",
    "ConfigError",
    "ContentBlock",
    "Episode",
    "ErrorInfo",
    "EvalOutput",
    "FloatArray",
    "FunctionCall",
    "ImageBlock",
    "ImageURL",
    "InvariantError",
    "Message",
    "RLLMError",
    "SamplingParams",
    "SchemaError",
    "Signal",
    "Step",
    "Task",
    "TerminationReason",
    "TextBlock",
    "TokenArray",
    "ToolCall",
    "TraceRecord",
    "TrainSequence",
    "Trajectory",
    "TrajectoryGroup",
    "Usage",
    "agent_view",
    "as_float_array",
    "as_token_array",
    "convert",
    "from_json",
    "from_msgpack",
    "grader_only_keys",
    "new_id",
    "to_builtins",
    "to_json",
    "to_msgpack",
]
