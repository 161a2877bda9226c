//! The `foldgate-bench` command.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    foldgate_bench::cli::main().await
}
