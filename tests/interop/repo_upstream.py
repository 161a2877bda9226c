#!/usr/bin/env python3
"""A source repository as an upstream MCP server, built with the official Python SDK's
MCPServer (FastMCP), for foldgate's gateway-run branch check: ten Rust source files of about
1,500 tokens each, one of which holds the handler of the FLUSH command.

Tools: `list_files() -> list[str]` and `read_file(path) -> str`. Both return types make FastMCP
declare an output schema and answer with content and structuredContent alike. The files are
generated the same way on every run; other checks import `FILES` to know what the model read.

Usage: repo_upstream.py --port 9200
"""

from __future__ import annotations

import argparse
import itertools

from mcp.server.mcpserver import MCPServer

# The file and function a run is expected to find.
FLUSH_FILE = "src/server/commands.rs"
FLUSH_FUNCTION = "handle_flush"

# Each file is generated up to about this many characters (about 1,500 o200k tokens of Rust).
FILE_CHARS = 6_300

# path -> (what the module holds, its state type's name, the map the methods work on, nouns)
MODULES: dict[str, tuple[str, str, str, list[str]]] = {
    "src/main.rs": ("Process start-up: arguments, runtime, listeners, shutdown.", "Startup", "services", ["listener", "runtime", "signal", "service", "probe"]),
    "src/config.rs": ("Settings, read from tidepool.toml and the environment.", "Settings", "sections", ["section", "override", "limit", "interval", "path"]),
    "src/server/listener.rs": ("The TCP accept loop and per-connection tasks.", "Listener", "connections", ["connection", "peer", "socket", "backlog", "handshake"]),
    FLUSH_FILE: ("Commands a client sends over a connection, and their handlers.", "CommandHandler", "partitions", ["partition", "subscription", "ack", "lease", "cursor"]),
    "src/server/protocol.rs": ("Frames on the wire: length-prefixed, versioned, checksummed.", "Codec", "frames", ["frame", "header", "checksum", "version", "payload"]),
    "src/storage/wal.rs": ("The write-ahead log: records appended in batches to segment files.", "WriteAheadLog", "segments", ["record", "batch", "segment", "offset", "checkpoint"]),
    "src/storage/segment.rs": ("Segment files: an append-only data file and its sparse index.", "SegmentSet", "files", ["segment", "index", "tail", "footer", "range"]),
    "src/storage/compaction.rs": ("Compaction: merges old segments and drops superseded records.", "Compactor", "plans", ["plan", "merge", "tombstone", "generation", "quota"]),
    "src/replication.rs": ("Replication to followers: shipping log ranges and tracking their acks.", "Replicator", "followers", ["follower", "range", "lag", "term", "snapshot"]),
    "src/metrics.rs": ("Counters and histograms, exported in the Prometheus text format.", "Registry", "families", ["counter", "histogram", "gauge", "label", "exporter"]),
}

# (verb, its past participle)
VERBS = [
    ("open", "opened"), ("refresh", "refreshed"), ("validate", "validated"), ("drain", "drained"),
    ("retire", "retired"), ("resolve", "resolved"), ("schedule", "scheduled"), ("trim", "trimmed"),
    ("restore", "restored"), ("rotate", "rotated"), ("probe", "probed"), ("settle", "settled"),
]

TEMPLATES = [
    '''
    /// {Verbs} the {noun} `id`, reading at most `limit` entries.
    ///
    /// Fails with `{err}::TooLarge` when the {noun} holds more than `limit` entries, so that one
    /// caller cannot hold the lock for long.
    pub fn {verb}_{noun}(&mut self, id: {Noun}Id, limit: usize) -> Result<usize, {err}> {{
        let entry = self.{field}.get_mut(&id).ok_or({err}::Unknown{Noun}(id))?;
        if entry.len() > limit {{
            tracing::debug!(%id, len = entry.len(), limit, "{verb} {noun}: over the limit");
            return Err({err}::TooLarge {{ id: id.into(), len: entry.len(), limit }});
        }}
        let started = Instant::now();
        let n = entry.{verb}(limit)?;
        self.metrics.observe("{module}.{verb}_{noun}", started.elapsed());
        Ok(n)
    }}
''',
    '''
    /// The {nouns} touched since `since` that are not {past} yet, oldest first.
    pub fn {nouns}_to_{verb}(&self, since: Offset) -> Vec<{Noun}Id> {{
        let mut out: Vec<{Noun}Id> = self
            .{field}
            .iter()
            .filter(|(_, e)| e.last_offset() >= since && !e.is_{past}())
            .map(|(id, _)| *id)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }}
''',
    '''
    /// {Verbs} the {noun} `id` within `deadline`; if that takes longer, the {noun} is left as it was.
    pub async fn {verb}_{noun}_within(&self, id: {Noun}Id, deadline: Duration) -> Result<(), {err}> {{
        let _permit = self.limiter.acquire().await.map_err(|_| {err}::ShuttingDown)?;
        match tokio::time::timeout(deadline, self.{verb}_{noun}_inner(id)).await {{
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {{
                tracing::warn!(%id, error = %e, "{verb} {noun} failed");
                Err(e)
            }}
            Err(_) => Err({err}::Timeout {{ what: "{verb} {noun}", after: deadline }}),
        }}
    }}
''',
    '''
    /// The next state of the {noun} being {past}: pending {nouns} are retried until
    /// `max_attempts`, then marked failed.
    fn next_{noun}_state(&self, state: {Noun}State) -> {Noun}State {{
        match state {{
            {Noun}State::Idle => {Noun}State::Idle,
            {Noun}State::Pending {{ since, attempts }} if attempts >= self.config.max_attempts => {{
                tracing::info!(?since, attempts, "{verb} {noun}: giving up");
                {Noun}State::Failed {{ since }}
            }}
            {Noun}State::Pending {{ since, attempts }} => {Noun}State::Pending {{ since, attempts: attempts + 1 }},
            other => other,
        }}
    }}
''',
]

FLUSH_HANDLER = '''
    /// Handles `FLUSH`: makes every record the connection has published to the partition
    /// durable before acknowledging. The connection's buffered records are appended to the
    /// write-ahead log in one batch, the log is synced to disk, and the reply carries the
    /// highest offset now durable. Other connections' buffers are left alone.
    pub async fn handle_flush(
        &mut self,
        conn: &mut Connection,
        req: FlushRequest,
    ) -> Result<Reply, CommandError> {
        let partition = self
            .partitions
            .get_mut(&req.partition)
            .ok_or(CommandError::UnknownPartition(req.partition))?;
        let pending = conn.take_buffered(req.partition);
        if pending.is_empty() {
            return Ok(Reply::Flushed { partition: req.partition, durable: partition.durable_offset() });
        }
        let started = Instant::now();
        let last = partition.wal.append_batch(&pending).await?;
        partition.wal.sync().await?;
        partition.set_durable(last);
        self.metrics.observe("commands.flush", started.elapsed());
        tracing::debug!(partition = %req.partition, records = pending.len(), durable = %last, "flushed");
        Ok(Reply::Flushed { partition: req.partition, durable: last })
    }
'''


def plural(noun: str) -> str:
    """A noun's plural, or a verb's third person."""
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def camel(word: str) -> str:
    return word[:1].upper() + word[1:]


def source(path: str) -> str:
    doc, state, field, nouns = MODULES[path]
    module = path.rsplit("/", 1)[-1].removesuffix(".rs")
    err = f"{state}Error"
    head = [
        f"//! {doc}",
        "",
        "use std::{collections::HashMap, sync::Arc, time::{Duration, Instant}};",
        "",
        "use tokio::sync::Semaphore;",
        "",
        "use crate::{config::Limits, metrics::Metrics, storage::Offset};",
        "",
        f"/// {doc.split(':')[0].rstrip('.')}.",
        "#[derive(Debug)]",
        f"pub struct {state} {{",
        f"    {field}: HashMap<{camel(nouns[0])}Id, Entry>,",
        "    limiter: Arc<Semaphore>,",
        "    metrics: Metrics,",
        "    config: Limits,",
        "}",
        "",
        f"impl {state} {{",
    ]
    body: list[str] = []
    pairs = itertools.product(VERBS, nouns)
    size = sum(len(line) + 1 for line in head)
    for i, ((verb, past), noun) in enumerate(pairs):
        method = TEMPLATES[i % len(TEMPLATES)].format(
            verb=verb, Verbs=camel(plural(verb)), past=past, noun=noun, nouns=plural(noun), Noun=camel(noun),
            field=field, err=err, module=module,
        )
        if path == FLUSH_FILE and i == 6:
            method = FLUSH_HANDLER + method
        body.append(method)
        size += len(method)
        if size >= FILE_CHARS:
            break
    return "\n".join(head) + "".join(body) + "}\n"


FILES: dict[str, str] = {path: source(path) for path in MODULES}

server = MCPServer("repo")


@server.tool()
def list_files() -> list[str]:
    """List the repository's source files, as paths relative to its root."""
    return sorted(FILES)


@server.tool()
def read_file(path: str) -> str:
    """Read one source file of the repository, by a path list_files gives."""
    try:
        return FILES[path]
    except KeyError:
        raise ValueError(f"no file {path!r}; list_files names them") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
