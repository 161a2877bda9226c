//! The replies a script is made of.

use super::*;

/// What the server answers one request with.
#[derive(Clone)]
pub enum Reply {
    /// A final answer (`finish_reason: "stop"` / `stop_reason: "end_turn"`).
    Text { text: String, usage: Usage },
    /// One assistant turn asking for tool calls, in parallel when there are
    /// several, optionally after some text (`finish_reason: "tool_calls"` /
    /// `stop_reason: "tool_use"`).
    ToolCalls { text: Option<String>, calls: Vec<ToolCall>, usage: Usage },
    /// A failed HTTP status, with a `retry-after` header when set. Without a
    /// body the provider's own error JSON is sent (see
    /// [`Provider::error_body`]); a body is sent as is, as JSON.
    Status { status: u16, retry_after: Option<u64>, body: Option<String> },
    /// Waits, then answers with the inner reply. The request is recorded
    /// before the wait, and a client that gives up meanwhile simply closes
    /// the connection.
    Delay { wait: Duration, then: Box<Reply> },
    /// A 200 whose body is the given text, verbatim: as `application/json`
    /// for a plain request, as `text/event-stream` for a streaming one.
    Garbage(String),
    /// Computed from the request when it arrives.
    Dynamic(Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync>),
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Text { text, usage } => {
                f.debug_struct("Text").field("text", text).field("usage", usage).finish()
            }
            Reply::ToolCalls { text, calls, usage } => f
                .debug_struct("ToolCalls")
                .field("text", text)
                .field("calls", calls)
                .field("usage", usage)
                .finish(),
            Reply::Status { status, retry_after, body } => f
                .debug_struct("Status")
                .field("status", status)
                .field("retry_after", retry_after)
                .field("body", body)
                .finish(),
            Reply::Delay { wait, then } => {
                f.debug_struct("Delay").field("wait", wait).field("then", then).finish()
            }
            Reply::Garbage(body) => f.debug_tuple("Garbage").field(body).finish(),
            Reply::Dynamic(_) => f.write_str("Dynamic(..)"),
        }
    }
}

impl Reply {
    /// A final answer.
    pub fn text(text: impl Into<String>, input_tokens: u32, output_tokens: u32) -> Self {
        Reply::Text { text: text.into(), usage: Usage { input_tokens, output_tokens } }
    }

    /// A turn asking for one tool call.
    pub fn tool_call(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: Value,
        input_tokens: u32,
        output_tokens: u32,
    ) -> Self {
        Reply::tool_calls([ToolCall::new(id, name, arguments)], input_tokens, output_tokens)
    }

    /// A turn asking for several tool calls at once.
    pub fn tool_calls(
        calls: impl IntoIterator<Item = ToolCall>,
        input_tokens: u32,
        output_tokens: u32,
    ) -> Self {
        Reply::ToolCalls {
            text: None,
            calls: calls.into_iter().collect(),
            usage: Usage { input_tokens, output_tokens },
        }
    }

    /// A failed status with the provider's own error body.
    pub fn status(status: u16) -> Self {
        Reply::Status { status, retry_after: None, body: None }
    }

    /// A 429 that asks the client to wait `retry_after_secs` seconds.
    pub fn rate_limited(retry_after_secs: u64) -> Self {
        Reply::Status { status: 429, retry_after: Some(retry_after_secs), body: None }
    }

    /// `then`, after `wait`.
    pub fn delayed(wait: Duration, then: Reply) -> Self {
        Reply::Delay { wait, then: Box::new(then) }
    }

    /// A reply computed from the request.
    pub fn dynamic(compute: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static) -> Self {
        Reply::Dynamic(Arc::new(compute))
    }
}

/// Token counts reported with an answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u32,
    pub output_tokens: u32,
}

/// One tool call the model asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The provider's call id (`call_…` for OpenAI, `toolu_…` for Anthropic
    /// by convention; any string is sent as given).
    pub id: String,
    pub name: String,
    /// Sent as a JSON string by OpenAI and as an object by Anthropic.
    pub arguments: Value,
}

impl ToolCall {
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        Self { id: id.into(), name: name.into(), arguments }
    }
}
