"""OpenAI wire types, shared by the HTTP server and the trio client: the request
body of every endpoint, and every response and streamed chunk.

Response types are frozen attrs classes with ``from_dict`` (lenient: unknown keys
are ignored, missing optional keys take their defaults, so the client also reads
other OpenAI-compatible servers) and ``to_dict`` (exact: the fields OpenAI sends,
with ``null`` where OpenAI sends ``null``; sluiceway extensions such as
``stop_reason`` are left out while they are ``None``). Both are generic
(``_codec.Wire``): a class states only how its wire form differs from its fields
(key order, fields omitted while None). Request types state the
ranges the server accepts in their annotations; the server decodes into them.

Light on purpose: this package imports only attrs, msgspec (for the range
annotations) and the standard library.
"""

from sluiceway.protocol.batches import (
    Batch,
    BatchCreateRequest,
    BatchList,
    FileDeleted,
    FileList,
    FileObject,
)
from sluiceway.protocol.chat import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatMessage,
    DeltaMessage,
)
from sluiceway.protocol.completions import Completion, CompletionChoice, CompletionChunk
from sluiceway.protocol.embeddings import Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage
from sluiceway.protocol.errors import ErrorObject
from sluiceway.protocol.logprobs import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)
from sluiceway.protocol.messages import ChatMessageParam, TextPart
from sluiceway.protocol.models import DetokenizeResponse, Model, ModelList, TokenizeResponse
from sluiceway.protocol.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    SamplingFields,
    StreamOptions,
    TokenizeRequest,
)
from sluiceway.protocol.responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    InputMessageItem,
    InputText,
    OutputItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningOptions,
    ReasoningText,
    Response,
    ResponseCreateRequest,
    ResponseDeleted,
    ResponseItemList,
    ResponseUsage,
)
from sluiceway.protocol.tools import (
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    NamedToolChoice,
    ResponseFormat,
    StructuredOutputs,
    Tool,
    ToolCall,
    ToolChoice,
)
from sluiceway.protocol.usage import CompletionTokensDetails, PromptTokensDetails, Usage

# The types above, and the modules other packages import for the types not named
# here (`tests/test_import_layering.py` holds them to this); `_codec` is this
# package's own.
__all__ = [
    "Batch",
    "BatchCreateRequest",
    "BatchList",
    "ChatCompletion",
    "ChatCompletionChoice",
    "ChatCompletionChunk",
    "ChatCompletionChunkChoice",
    "ChatCompletionRequest",
    "ChatLogprobs",
    "ChatMessage",
    "ChatMessageParam",
    "ChatTokenLogprob",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionLogprobs",
    "CompletionRequest",
    "CompletionTokensDetails",
    "DeltaFunctionCall",
    "DeltaMessage",
    "DeltaToolCall",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "Embedding",
    "EmbeddingList",
    "EmbeddingRequest",
    "EmbeddingUsage",
    "ErrorObject",
    "FileDeleted",
    "FileList",
    "FileObject",
    "FunctionCall",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "FunctionDefinition",
    "InputItem",
    "InputMessageItem",
    "InputText",
    "JsonSchemaFormat",
    "Model",
    "ModelList",
    "NamedToolChoice",
    "OutputItem",
    "OutputMessage",
    "OutputText",
    "PromptTokensDetails",
    "ReasoningItem",
    "ReasoningOptions",
    "ReasoningText",
    "Response",
    "ResponseCreateRequest",
    "ResponseDeleted",
    "ResponseFormat",
    "ResponseItemList",
    "ResponseUsage",
    "SamplingFields",
    "StreamOptions",
    "StructuredOutputs",
    "TextPart",
    "TokenizeRequest",
    "TokenizeResponse",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "TopLogprob",
    "Usage",
    # modules
    "anthropic",
    "batches",
    "constraints",
    "embeddings",
    "requests",
    "responses",
    "tools",
]
