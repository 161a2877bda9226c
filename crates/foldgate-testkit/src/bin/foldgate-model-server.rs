//! The scripted model provider ([`ModelServer`]) as a process of its own,
//! for checks that drive the real gateway from outside Rust (the interop
//! script).
//!
//! ```text
//! foldgate-model-server --script SCRIPT.json [--record REQUESTS.jsonl]
//! ```
//!
//! Once listening it prints `model server at http://127.0.0.1:PORT/v1/` on
//! stdout: the `base_url` of a `[[models]]` entry, for either provider. It
//! serves until SIGTERM or SIGINT, or until its stdin closes when stdin is a
//! pipe or a socket (so that a parent that dies takes it along).
//!
//! The script is a JSON list of entries, each the replies, in order, for
//! the requests whose messages mention its marker (see
//! [`ModelServer::script`]); an entry without a marker feeds the requests
//! that match none:
//!
//! ```json
//! [{"marker": "flush handler", "replies": [
//!   {"tool_calls": [{"id": "call_1", "name": "repo__list_files", "arguments": {}}],
//!    "input_tokens": 600, "output_tokens": 20},
//!   {"text": "It is handle_flush in src/server/commands.rs.",
//!    "input_tokens": 900, "output_tokens": 15}
//! ]}]
//! ```
//!
//! A reply is one of: `text` (a final answer); `tool_calls` (one turn asking
//! for them, in parallel, optionally after some `text`); `status` (a failed
//! HTTP status, with an optional `retry_after` in seconds and `body`, sent
//! as is); `garbage` (a 200 whose body is that text, verbatim). Answers
//! report `input_tokens` and `output_tokens` (0 when omitted) as the
//! provider's usage, and any reply may wait `delay_ms` first.
//!
//! With `--record`, every request received is appended to the file as one
//! JSON line: `seq`, `provider` (`openai` or `anthropic`), `stream`,
//! `model`, `api_key` (the key as the provider reads it), `headers` and
//! `body`. A request is written before it is answered.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError, Weak},
    time::Duration,
};

use anyhow::{Context, bail};
use clap::Parser;
use foldgate_testkit::{
    child::stdin_closed,
    model_server::{ModelServer, Provider, RecordedRequest, Reply, ToolCall, Usage},
};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::signal::unix::{SignalKind, signal};

/// Serves scripted model answers in both providers' wire formats.
#[derive(Debug, Parser)]
struct Args {
    /// The replies to give, as a JSON list of `{"marker", "replies"}` entries.
    #[arg(long)]
    script: PathBuf,
    /// Append every request received to this file, one JSON object per line.
    #[arg(long)]
    record: Option<PathBuf>,
}

/// One entry of the script file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptEntry {
    /// Requests whose messages mention this text take these replies; none:
    /// requests that mention no marker do.
    #[serde(default)]
    marker: Option<String>,
    replies: Vec<ScriptedReply>,
}

/// One reply as the script file spells it; see the module docs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedReply {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ScriptedCall>>,
    #[serde(default)]
    input_tokens: u32,
    #[serde(default)]
    output_tokens: u32,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    retry_after: Option<u64>,
    /// The body of a failed status: a string is sent as it is, anything else
    /// as its JSON.
    #[serde(default)]
    body: Option<Value>,
    #[serde(default)]
    garbage: Option<String>,
    #[serde(default)]
    delay_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedCall {
    id: String,
    name: String,
    #[serde(default = "empty_object")]
    arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

impl TryFrom<ScriptedReply> for Reply {
    type Error = String;

    fn try_from(r: ScriptedReply) -> Result<Self, Self::Error> {
        let kinds = [
            r.text.is_some() && r.tool_calls.is_none(),
            r.tool_calls.is_some(),
            r.status.is_some(),
            r.garbage.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(
                "a reply needs exactly one of `text`, `tool_calls`, `status` or `garbage` \
                        (`text` may come with `tool_calls`)"
                    .into(),
            );
        }
        let status_only = r.retry_after.is_some() || r.body.is_some();
        if status_only && r.status.is_none() {
            return Err("`retry_after` and `body` belong to a `status` reply".into());
        }
        let answer = r.text.is_some() || r.tool_calls.is_some();
        if !answer && (r.input_tokens != 0 || r.output_tokens != 0) {
            return Err("`input_tokens` and `output_tokens` belong to an answer".into());
        }
        let reply = if let Some(calls) = r.tool_calls {
            if calls.is_empty() {
                return Err("`tool_calls` must not be empty (use `text` for a final answer)".into());
            }
            Reply::ToolCalls {
                text: r.text,
                calls: calls
                    .into_iter()
                    .map(|c| ToolCall::new(c.id, c.name, c.arguments))
                    .collect(),
                usage: Usage { input_tokens: r.input_tokens, output_tokens: r.output_tokens },
            }
        } else if let Some(text) = r.text {
            Reply::text(text, r.input_tokens, r.output_tokens)
        } else if let Some(status) = r.status {
            let body = r.body.map(|body| match body {
                Value::String(text) => text,
                other => other.to_string(),
            });
            Reply::Status { status, retry_after: r.retry_after, body }
        } else {
            Reply::Garbage(r.garbage.unwrap_or_default())
        };
        Ok(match r.delay_ms {
            Some(ms) => Reply::delayed(Duration::from_millis(ms), reply),
            None => reply,
        })
    }
}

/// A script's entries, checked.
fn load_script(path: &Path) -> anyhow::Result<Vec<(Option<String>, Vec<Reply>)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let entries: Vec<ScriptEntry> = serde_json::from_str(&text).with_context(|| {
        format!("{}: not a list of {{marker, replies}} entries", path.display())
    })?;
    entries
        .into_iter()
        .enumerate()
        .map(|(i, entry)| {
            if entry.marker.as_deref() == Some("") {
                bail!("{}: entry {i}: an empty marker would match every request", path.display());
            }
            let replies = entry
                .replies
                .into_iter()
                .enumerate()
                .map(|(j, reply)| {
                    Reply::try_from(reply).map_err(|e| {
                        anyhow::anyhow!("{}: entry {i}, reply {j}: {e}", path.display())
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok((entry.marker, replies))
        })
        .collect()
}

/// Writes the server's requests to the record file, each once, in the
/// order they arrived.
#[derive(Debug)]
struct Recorder {
    out: Mutex<Record>,
}

#[derive(Debug)]
struct Record {
    file: BufWriter<File>,
    /// Requests written so far.
    written: usize,
}

impl Recorder {
    fn create(path: &Path) -> anyhow::Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { out: Mutex::new(Record { file: BufWriter::new(file), written: 0 }) })
    }

    /// Writes the requests of `all` not written yet.
    fn sync(&self, all: &[RecordedRequest]) -> io::Result<()> {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        let start = out.written;
        for (seq, request) in all.iter().enumerate().skip(start) {
            serde_json::to_writer(&mut out.file, &record_line(seq + 1, request))?;
            out.file.write_all(b"\n")?;
            out.written = seq + 1;
        }
        out.file.flush()
    }
}

fn record_line(seq: usize, request: &RecordedRequest) -> Value {
    let mut headers = Map::new();
    for (name, value) in &request.headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match headers.get_mut(name.as_str()) {
            Some(Value::String(seen)) => {
                seen.push_str(", ");
                seen.push_str(&value);
            }
            _ => {
                headers.insert(name.as_str().to_owned(), Value::String(value));
            }
        }
    }
    json!({
        "seq": seq,
        "provider": match request.provider {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        },
        "stream": request.stream,
        "model": request.model(),
        "api_key": request.api_key(),
        "headers": headers,
        "body": request.body,
    })
}

/// Every request up to the current one written before it is answered.
fn recorded(reply: Reply, server: Weak<ModelServer>, recorder: Arc<Recorder>) -> Reply {
    Reply::dynamic(move |_request| {
        if let Some(server) = server.upgrade()
            && let Err(e) = recorder.sync(&server.requests())
        {
            eprintln!("foldgate-model-server: writing the record failed: {e}");
        }
        reply.clone()
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let script = load_script(&args.script)?;
    let recorder = args.record.as_deref().map(Recorder::create).transpose()?.map(Arc::new);
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;

    let server = Arc::new(ModelServer::start().await);
    for (marker, replies) in script {
        let replies = replies.into_iter().map(|reply| match &recorder {
            Some(recorder) => recorded(reply, Arc::downgrade(&server), Arc::clone(recorder)),
            None => reply,
        });
        match marker {
            Some(marker) => server.script(&marker, replies),
            None => replies.for_each(|reply| server.push(reply)),
        }
    }
    {
        let mut stdout = io::stdout().lock();
        writeln!(stdout, "model server at {}", server.base_url())?;
        stdout.flush()?;
    }

    let closed = stdin_closed();
    // Requests answered without a script (the "no scripted reply" 500) are
    // written here.
    let mut sweep = tokio::time::interval(Duration::from_millis(100));
    tokio::pin!(closed);
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            () = &mut closed => break,
            _ = sweep.tick() => {
                if let Some(recorder) = &recorder {
                    recorder.sync(&server.requests()).context("writing the record")?;
                }
            }
        }
    }
    let requests = server.requests();
    if let Some(recorder) = &recorder {
        recorder.sync(&requests).context("writing the record")?;
    }
    eprintln!(
        "foldgate-model-server: {} requests received, {} scripted replies unused",
        requests.len(),
        server.unused_replies()
    );
    Ok(())
}
