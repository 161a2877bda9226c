//! What an upstream says about a call while it runs: its progress and its
//! log messages, handed on to the agent that made the call.
//!
//! A call that wants them carries a [`Listener`]. When the agent asked for
//! progress (its request's `progressToken`), the upstream is sent a
//! progress token of the gateway's own,
//! unique to the call, never the agent's: calls that share a connection or
//! a stdio process are told apart by it, and an agent cannot pick a token
//! that reaches another agent's call; progress that does not increase is
//! dropped, as MCP asks. Log messages are handed on when the
//! agent's request named the least level it wants
//! (`io.modelcontextprotocol/logLevel` in its `_meta`, as a stateless
//! server takes it), at that level or above; the level goes to the
//! upstream too. What comes back is checked against the MCP shapes,
//! scrubbed of secrets whole (fail closed: a notice that cannot be
//! scrubbed, or that is over [`MAX_SCRUBBED`], is dropped), then cut to
//! [`MAX_TEXT`], before it is queued: cutting first could leave the start
//! of a secret that the scrubber no longer recognises. A full queue drops a
//! notice, since a notice only informs.

use std::sync::{Arc, Mutex, PoisonError};

use foldgate_engine::Scrubber;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// How many notices of one call may wait for the agent; more are dropped.
pub const QUEUE: usize = 64;
/// The longest text a notice carries (a progress message; a log message's
/// data, as JSON), in bytes; the rest is cut.
pub const MAX_TEXT: usize = 2_048;
/// The longest notification (its params as JSON, in bytes) that is
/// scrubbed and relayed; a longer one is dropped whole.
pub const MAX_SCRUBBED: usize = 64 * 1024;

/// The MCP log levels, least severe first.
pub const LOG_LEVELS: [&str; 8] =
    ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];

/// One notification about a call in flight, checked and scrubbed.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// `notifications/progress` for the call's token.
    Progress { progress: f64, total: Option<f64>, message: Option<String> },
    /// `notifications/message`; `level` is one of [`LOG_LEVELS`].
    Log { level: &'static str, logger: Option<String>, data: Value },
}

/// What an agent asked to hear of its call while it runs, and where it
/// goes.
#[derive(Debug, Clone, Copy)]
pub struct Relay<'a> {
    pub sink: &'a mpsc::Sender<Notice>,
    /// The agent gave a `progressToken`.
    pub progress: bool,
    /// The least log level the agent asked for, as it wrote it.
    pub min_log: Option<&'a str>,
}

/// Where one call's notices go.
#[derive(Debug, Clone)]
pub struct Listener {
    /// The token sent upstream, if the agent asked for progress.
    token: Option<String>,
    /// The least severe log level handed on (its index in [`LOG_LEVELS`]);
    /// `None`: no log messages.
    min_log: Option<usize>,
    sink: mpsc::Sender<Notice>,
    /// `None`: the upstream is not scrubbed (`scrub_results = false`).
    scrubber: Option<Arc<dyn Scrubber>>,
    /// The progress last relayed.
    last_progress: Arc<Mutex<Option<f64>>>,
}

impl Listener {
    /// A listener that queues onto `sink`: progress if `progress` (the
    /// upstream is sent a token of its own), and log messages at `min_log`
    /// or above (a level of [`LOG_LEVELS`]; another text or `None`: no log
    /// messages).
    pub fn new(
        sink: mpsc::Sender<Notice>,
        progress: bool,
        min_log: Option<&str>,
        scrubber: Option<Arc<dyn Scrubber>>,
    ) -> Self {
        let token = progress.then(|| format!("foldgate-{}", uuid::Uuid::new_v4().simple()));
        let min_log = min_log.and_then(|level| LOG_LEVELS.iter().position(|l| *l == level));
        Self { token, min_log, sink, scrubber, last_progress: Arc::default() }
    }

    /// The least log level handed on, if log messages are.
    pub fn min_log(&self) -> Option<&'static str> {
        self.min_log.map(|i| LOG_LEVELS[i])
    }

    /// The progress token the upstream is sent, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Whether a notification is progress for this call.
    pub(crate) fn is_mine(&self, method: &str, params: Option<&Value>) -> bool {
        method == "notifications/progress"
            && self.token.is_some()
            && params.and_then(|p| p.get("progressToken")).and_then(Value::as_str)
                == self.token.as_deref()
    }

    /// Queues a notification of the upstream's if it is progress for this
    /// call or a log message (which the caller has tied to this call);
    /// anything else, or anything malformed, is ignored.
    pub(crate) fn offer(&self, method: &str, params: Option<&Value>) {
        let notice = match method {
            "notifications/progress" if self.is_mine(method, params) => params.and_then(progress),
            "notifications/message" => params.and_then(log).filter(|notice| self.wants_log(notice)),
            _ => None,
        };
        let Some(notice) = notice else { return };
        if params.and_then(|p| serde_json::to_string(p).ok()).is_none_or(|p| p.len() > MAX_SCRUBBED)
        {
            tracing::debug!("a notice of an upstream call was dropped: it is too long");
            return;
        }
        if let Notice::Progress { progress, .. } = notice {
            let mut last = self.last_progress.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|last| progress <= last) {
                return;
            }
            *last = Some(progress);
        }
        let Some(notice) = self.scrubbed(notice) else { return };
        if self.sink.try_send(bounded(notice)).is_err() {
            tracing::debug!("a notice of an upstream call was dropped: the agent is behind");
        }
    }

    fn wants_log(&self, notice: &Notice) -> bool {
        let Notice::Log { level, .. } = notice else { return false };
        let rank = LOG_LEVELS.iter().position(|l| l == level);
        self.min_log.is_some_and(|min| rank.is_some_and(|rank| rank >= min))
    }

    fn scrubbed(&self, notice: Notice) -> Option<Notice> {
        let Some(scrubber) = &self.scrubber else { return Some(notice) };
        let scrub = |value: Value| match scrubber.scrub_json(&value) {
            Ok(scrubbed) => Some(scrubbed.value),
            Err(e) => {
                tracing::warn!(error = %e, "a notice of an upstream call could not be scrubbed; it was dropped");
                None
            }
        };
        Some(match notice {
            Notice::Progress { progress, total, message: Some(message) } => {
                let message = scrub(Value::String(message))?.as_str().map(str::to_owned);
                Notice::Progress { progress, total, message }
            }
            Notice::Log { level, logger, data } => {
                let scrubbed = scrub(json!({"logger": logger, "data": data}))?;
                let logger = scrubbed["logger"].as_str().map(str::to_owned);
                Notice::Log { level, logger, data: scrubbed["data"].clone() }
            }
            progress @ Notice::Progress { message: None, .. } => progress,
        })
    }
}

fn progress(params: &Value) -> Option<Notice> {
    let progress = params.get("progress")?.as_f64()?;
    let total = match params.get("total") {
        None | Some(Value::Null) => None,
        Some(total) => Some(total.as_f64()?),
    };
    let message = params.get("message").and_then(Value::as_str).map(str::to_owned);
    Some(Notice::Progress { progress, total, message })
}

fn log(params: &Value) -> Option<Notice> {
    let level = params.get("level").and_then(Value::as_str)?;
    let level = LOG_LEVELS.into_iter().find(|l| *l == level)?;
    let logger = params.get("logger").and_then(Value::as_str).map(str::to_owned);
    let data = params.get("data")?.clone();
    Some(Notice::Log { level, logger, data })
}

/// A scrubbed notice with each text within [`MAX_TEXT`]; log data longer
/// than that as JSON becomes its JSON text, cut.
fn bounded(notice: Notice) -> Notice {
    match notice {
        Notice::Progress { progress, total, message } => {
            Notice::Progress { progress, total, message: message.as_deref().map(cut) }
        }
        Notice::Log { level, logger, data } => {
            let data = match data {
                Value::String(text) => Value::String(cut(&text)),
                other => match serde_json::to_string(&other) {
                    Ok(text) if text.len() > MAX_TEXT => Value::String(cut(&text)),
                    _ => other,
                },
            };
            Notice::Log { level, logger: logger.as_deref().map(cut), data }
        }
    }
}

/// `text` within [`MAX_TEXT`] bytes, cut at a character boundary and
/// marked.
fn cut(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [cut]", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(progress: bool) -> (Listener, mpsc::Receiver<Notice>) {
        let (tx, rx) = mpsc::channel(2);
        (Listener::new(tx, progress, Some("debug"), None), rx)
    }

    #[test]
    fn progress_for_this_call_only() {
        let (mine, mut rx) = listener(true);
        let (other, _) = listener(true);
        let token = mine.token().unwrap().to_owned();
        assert_ne!(Some(token.as_str()), other.token(), "each call has its own token");
        let params = json!({"progressToken": token, "progress": 2, "total": 5, "message": "two"});
        mine.offer("notifications/progress", Some(&params));
        let theirs = json!({"progressToken": other.token(), "progress": 3});
        mine.offer("notifications/progress", Some(&theirs));
        assert_eq!(
            rx.try_recv().unwrap(),
            Notice::Progress { progress: 2.0, total: Some(5.0), message: Some("two".into()) }
        );
        assert!(rx.try_recv().is_err(), "another call's progress is not this call's");
        // Without a token nothing is progress.
        let (quiet, mut rx) = listener(false);
        quiet.offer("notifications/progress", Some(&json!({"progressToken": null, "progress": 1})));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn malformed_notifications_are_ignored_and_long_text_cut() {
        let (l, mut rx) = listener(true);
        let token = l.token().unwrap().to_owned();
        l.offer("notifications/progress", Some(&json!({"progressToken": token, "progress": "x"})));
        l.offer("notifications/message", Some(&json!({"level": "loud", "data": "x"})));
        l.offer("notifications/message", Some(&json!({"level": "info"})));
        l.offer("notifications/resources/updated", Some(&json!({"uri": "x"})));
        assert!(rx.try_recv().is_err());
        let long = "é".repeat(MAX_TEXT);
        l.offer("notifications/message", Some(&json!({"level": "warning", "data": long})));
        let Notice::Log { level, data, .. } = rx.try_recv().unwrap() else { panic!() };
        assert_eq!(level, "warning");
        let data = data.as_str().unwrap();
        assert!(data.len() <= MAX_TEXT + "… [cut]".len() && data.ends_with("[cut]"));
    }

    #[test]
    fn log_messages_at_the_level_asked_or_above() {
        let (tx, mut rx) = mpsc::channel(8);
        let l = Listener::new(tx.clone(), false, Some("warning"), None);
        assert_eq!(l.min_log(), Some("warning"));
        for level in ["info", "warning", "debug", "emergency"] {
            l.offer("notifications/message", Some(&json!({"level": level, "data": level})));
        }
        let levels: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|n| match n {
                Notice::Log { level, .. } => level,
                Notice::Progress { .. } => "progress",
            })
            .collect();
        assert_eq!(levels, ["warning", "emergency"]);
        for unwanted in [None, Some("loud")] {
            let l = Listener::new(tx.clone(), false, unwanted, None);
            assert_eq!(l.min_log(), None);
            l.offer("notifications/message", Some(&json!({"level": "emergency", "data": 1})));
            assert!(rx.try_recv().is_err(), "no level asked, no log messages");
        }
    }

    #[test]
    fn progress_that_does_not_increase_is_dropped() {
        let (tx, mut rx) = mpsc::channel(8);
        let l = Listener::new(tx, true, None, None);
        let token = l.token().unwrap().to_owned();
        for progress in [1.0, 1.0, 0.5, 2.0] {
            let params = json!({"progressToken": token, "progress": progress});
            l.clone().offer("notifications/progress", Some(&params));
        }
        let seen: Vec<f64> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|n| match n {
                Notice::Progress { progress, .. } => progress,
                Notice::Log { .. } => f64::NAN,
            })
            .collect();
        assert_eq!(seen, [1.0, 2.0], "a clone shares what was relayed");
    }

    #[test]
    fn a_secret_across_the_cut_is_scrubbed_before_it() {
        let (tx, mut rx) = mpsc::channel(8);
        let scrubber = foldgate_engine::default_scrubber().unwrap();
        let l = Listener::new(tx, true, Some("info"), Some(scrubber));
        let token = l.token().unwrap().to_owned();
        let secret = "ghp_R7kP2mX9qL4vN8wZ3tY6bH1cJ5dF0gS2aE7u";
        let text = format!("{} {secret} and more", "x".repeat(MAX_TEXT - 10));
        let params = json!({"progressToken": token, "progress": 1, "message": text});
        l.offer("notifications/progress", Some(&params));
        let params = json!({"level": "info", "logger": text, "data": {"detail": text}});
        l.offer("notifications/message", Some(&params));
        let progress = rx.try_recv().unwrap();
        let Notice::Progress { message: Some(message), .. } = progress else { panic!() };
        let log = rx.try_recv().unwrap();
        let Notice::Log { logger: Some(logger), data, .. } = log else { panic!() };
        let data = data.as_str().unwrap().to_owned();
        for shown in [message, logger, data] {
            assert!(shown.ends_with("… [cut]"), "{shown}");
            assert!(!shown.contains("ghp_R7"), "the start of the secret survived: {shown}");
        }

        // Too long to scrub inline: dropped whole.
        let huge = json!({"level": "info", "data": "y".repeat(MAX_SCRUBBED)});
        l.offer("notifications/message", Some(&huge));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_full_queue_drops() {
        let (l, mut rx) = listener(false);
        for n in 0..5 {
            l.offer("notifications/message", Some(&json!({"level": "info", "data": n})));
        }
        assert_eq!(std::iter::from_fn(|| rx.try_recv().ok()).count(), 2);
    }
}
