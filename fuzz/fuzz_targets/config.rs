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
//!   or the password of a URL. The target plants a canary of its own as
//!   each such secret before loading, so that what it looks for occurs
//!   nowhere else in the input by chance.
#![no_main]

use std::{io::Write as _, sync::LazyLock};

use foldgate::config::Config;
use libfuzzer_sys::fuzz_target;

static FILE: LazyLock<tempfile::NamedTempFile> =
    LazyLock::new(|| tempfile::NamedTempFile::new().expect("a temporary file"));

/// Whether a setting or variable holds a secret by its name. An address
/// (`token_url`, `jwks_url`) is not one, though its password is; nor is a
/// lifetime or a count about tokens (`token_ttl`, `token_cache_entries`).
fn secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    !["url", "ttl", "entries"].iter().any(|s| name.ends_with(s))
        && ["secret", "password", "api_key", "token"].iter().any(|s| name.contains(s))
}

/// Whether a shell could set a variable of this name (the loader reads no
/// other, by name or as a `${VAR}`).
fn settable(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Plants secrets whose text occurs nowhere else: each secret value, and
/// each URL's password, becomes a canary the checks then look for.
#[derive(Default)]
struct Canaries(Vec<String>);

impl Canaries {
    fn next(&mut self) -> String {
        let canary = format!("Cq{}zXv9Kanary", self.0.len());
        self.0.push(canary.clone());
        canary
    }

    /// `value` with its secrets planted: the whole value if `name` is a
    /// secret's (its `${VAR}` references, which may be shown, kept), the
    /// password of a URL (`scheme://user:password@host`) otherwise.
    fn plant(&mut self, name: &str, value: &str) -> String {
        if secret_name(name) {
            let references: String = value
                .match_indices("${")
                .filter_map(|(at, _)| value[at..].find('}').map(|end| &value[at..=at + end]))
                .collect();
            return format!("{}{references}", self.next());
        }
        let Some((scheme, rest)) = value.split_once("://") else { return value.to_owned() };
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(authority_end);
        let Some((userinfo, host)) = authority.rsplit_once('@') else { return value.to_owned() };
        let Some((user, _)) = userinfo.split_once(':') else { return value.to_owned() };
        format!("{scheme}://{user}:{}@{host}{path}", self.next())
    }

    fn plant_toml(&mut self, value: &mut toml::Value, name: &str) {
        match value {
            toml::Value::String(s) => *s = self.plant(name, s),
            toml::Value::Table(table) => {
                for (key, value) in table.iter_mut() {
                    self.plant_toml(value, key);
                }
            }
            toml::Value::Array(items) => items.iter_mut().for_each(|v| self.plant_toml(v, name)),
            _ => {}
        }
    }

    /// A file that is not TOML, with the secrets of its lines that read as
    /// `name = "value"` planted, the rest as it is.
    fn plant_lines(&mut self, file: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(file.len());
        for line in file.split_inclusive(|&b| b == b'\n') {
            let planted = std::str::from_utf8(line).ok().and_then(|text| {
                let (name, value) = text.split_once('=')?;
                let value = value.trim().strip_prefix('"')?.strip_suffix('"')?;
                let name = name.trim();
                let key = name.rsplit('.').next()?;
                let ending = if text.ends_with('\n') { "\n" } else { "" };
                Some(format!("{name} = \"{}\"{ending}", self.plant(key, value)))
            });
            match planted {
                Some(text) => out.extend_from_slice(text.as_bytes()),
                None => out.extend_from_slice(line),
            }
        }
        out
    }

    fn check(&self, text: &str, what: &str) {
        for canary in &self.0 {
            assert!(!text.contains(canary.as_str()), "{what} repeats a secret: {text}");
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let (file, env) = match input.iter().position(|&b| b == 0) {
        Some(at) => (&input[..at], &input[at + 1..]),
        None => (input, &b""[..]),
    };
    let Ok(env) = std::str::from_utf8(env) else { return };
    let mut canaries = Canaries::default();
    // A file that is TOML is written back with its secrets planted; one
    // that is not, line by line where a line reads as a setting.
    let file = match std::str::from_utf8(file).ok().and_then(|f| f.parse::<toml::Table>().ok()) {
        Some(table) => {
            let mut value = toml::Value::Table(table);
            canaries.plant_toml(&mut value, "");
            match toml::to_string(&value) {
                Ok(text) => text.into_bytes(),
                Err(_) => return,
            }
        }
        None => canaries.plant_lines(file),
    };
    let env: Vec<(String, String)> = env
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| {
            let value = if settable(name) { canaries.plant(name, value) } else { value.to_owned() };
            (name.to_owned(), value)
        })
        .collect();
    {
        let mut handle = FILE.reopen().expect("the temporary file reopens");
        handle.set_len(0).expect("truncate");
        handle.write_all(&file).expect("write");
    }

    match Config::load(Some(FILE.path()), env) {
        Ok(config) => {
            if let Err(e) = config.validate() {
                panic!("a loaded configuration fails validation: {e}");
            }
            canaries.check(&format!("{config:?}"), "`Debug`");
        }
        Err(e) => canaries.check(&e.to_string(), "the error"),
    }
});
