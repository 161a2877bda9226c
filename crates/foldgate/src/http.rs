//! The HTTP server loop: accepts connections, serves HTTP/1.1 and h2c on
//! each, and drains them on shutdown.
//!
//! It exists (rather than `axum::serve`) to give connections a clock: an
//! HTTP/1 connection that does not deliver a complete request head within
//! [`ServerSettings::header_read_timeout`] — a client that sends half its
//! headers, or a kept-alive connection left idle — is closed, so that
//! slow or abandoned clients cannot pin sockets and tasks indefinitely.

use std::{io, time::Duration};

use axum::Router;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How connections are served.
#[derive(Debug, Clone, Copy)]
pub struct ServerSettings {
    pub header_read_timeout: Duration,
}

/// How long to pause accepting after an error that is not about one
/// connection (such as running out of file descriptors), so that the loop
/// does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `shutdown` is cancelled, then stops
/// accepting and waits for the open connections to finish their requests
/// (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    settings: ServerSettings,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(settings.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(app.clone());
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                // Timeouts, resets and malformed requests end here; none is
                // the server's fault.
                tracing::debug!(error = %e, "connection closed with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Errors that concern only the connection being accepted.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
