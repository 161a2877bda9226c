//! What the testkit's servers need when they run as processes of their own
//! (`foldgate-files-upstream`, `foldgate-model-server`): going away with
//! the parent that started them.

use std::{
    fs::File,
    io::{self, Read},
    os::{fd::AsFd, unix::fs::FileTypeExt},
};

use tokio::sync::oneshot;

/// Resolves when stdin reaches its end, if stdin is a pipe or a socket;
/// never otherwise (a terminal or `/dev/null` says nothing of the parent).
pub async fn stdin_closed() {
    let (tx, rx) = oneshot::channel::<()>();
    let piped = io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(|fd| File::from(fd).metadata())
        .is_ok_and(|m| m.file_type().is_fifo() || m.file_type().is_socket());
    if piped {
        // A thread of its own: a blocking read cannot be cancelled, and it
        // must not hold the runtime's shutdown.
        std::thread::spawn(move || {
            let mut sink = [0_u8; 4096];
            let mut stdin = io::stdin();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            let _ = tx.send(());
        });
        // A read error ends the thread too: either way the parent is gone.
        let _ = rx.await;
    } else {
        std::future::pending::<()>().await;
    }
}
