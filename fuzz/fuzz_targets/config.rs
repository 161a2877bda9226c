//! The configuration loader: a TOML file with the environment laid over it,
//! as `foldgate serve` and `foldgate check-config` read them.
//!
//! Input: the file's text, a NUL byte, then environment variables, one
//! `NAME=value` per line.
//!
//! Invariants:
//! - loading never panics, whatever the file and the variables hold;
//! - a configuration that loads passes its own validation;
//! - neither an error nor the configuration's `Debug` form repeats a secret:
//!   the value of a setting or variable named for a secret, a password, a
//!   key or a token (but for its `${VAR}` references, which may be shown),
//!   or the password of a URL.
#![no_main]

use std::{io::Write as _, sync::LazyLock};

use foldgate::config::Config;
use libfuzzer_sys::fuzz_target;

static FILE: LazyLock<tempfile::NamedTempFile> =
    LazyLock::new(|| tempfile::NamedTempFile::new().expect("a temporary file"));

fn secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["secret", "password", "api_key", "token"].iter().any(|s| name.contains(s))
}

/// The password of a URL (`scheme://user:password@host/…`), if it has one,
/// as RFC 3986 reads it: the authority ends at the first `/`, `?` or `#`.
fn url_password(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let userinfo = authority.rsplit_once('@')?.0;
    Some(userinfo.split_once(':')?.1)
}

/// A credential's own text: without its `${VAR}` references, which name
/// a variable and may be shown.
fn literal(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        match rest[at..].find('}') {
            Some(end) => rest = &rest[at + end + 1..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

fn toml_secrets(value: &toml::Value, name: &str, out: &mut Vec<String>) {
    match value {
        toml::Value::String(s) => {
            if secret_name(name) {
                out.push(literal(s));
            }
            out.extend(url_password(s).map(str::to_owned));
        }
        toml::Value::Table(table) => table.iter().for_each(|(k, v)| toml_secrets(v, k, out)),
        toml::Value::Array(items) => items.iter().for_each(|v| toml_secrets(v, name, out)),
        _ => {}
    }
}

fuzz_target!(|input: &[u8]| {
    let (file, env) = match input.iter().position(|&b| b == 0) {
        Some(at) => (&input[..at], &input[at + 1..]),
        None => (input, &b""[..]),
    };
    let Ok(env) = std::str::from_utf8(env) else { return };
    let env: Vec<(String, String)> = env
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    {
        let mut handle = FILE.reopen().expect("the temporary file reopens");
        handle.set_len(0).expect("truncate");
        handle.write_all(file).expect("write");
    }
    let mut secrets: Vec<String> = Vec::new();
    if let Ok(table) = std::str::from_utf8(file).unwrap_or_default().parse::<toml::Table>() {
        toml_secrets(&toml::Value::Table(table), "", &mut secrets);
    }
    for (name, value) in &env {
        if secret_name(name) {
            secrets.push(value.clone());
        }
        secrets.extend(url_password(value).map(str::to_owned));
    }
    secrets.retain(|s| s.len() >= 8);

    match Config::load(Some(FILE.path()), env.clone()) {
        Ok(config) => {
            if let Err(e) = config.validate() {
                panic!("a loaded configuration fails validation: {e}");
            }
            let shown = format!("{config:?}");
            for secret in &secrets {
                assert!(!shown.contains(secret.as_str()), "`Debug` shows a secret: {secret:?}");
            }
        }
        Err(e) => {
            let message = e.to_string();
            for secret in &secrets {
                assert!(
                    !message.contains(secret.as_str()),
                    "the error repeats a secret: {message}"
                );
            }
        }
    }
});
