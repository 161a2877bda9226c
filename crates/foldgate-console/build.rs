//! Lists the built front end in `assets/` as a Rust table of
//! `include_bytes!`, each file with an ETag computed from its bytes. Cargo
//! rebuilds when a listed file changes (include_bytes!) and when files are
//! added or removed (`rerun-if-changed` on the directory).

use std::{
    env,
    error::Error,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
};

fn main() -> Result<(), Box<dyn Error>> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("assets");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    if root.is_dir() {
        collect(&root, &mut files)?;
    }
    files.sort();
    let mut table = String::from("&[\n");
    for file in &files {
        let relative = file.strip_prefix(&root)?;
        let name = relative
            .components()
            .map(|c| c.as_os_str().to_str().ok_or("an asset path is not UTF-8"))
            .collect::<Result<Vec<_>, _>>()?
            .join("/");
        let bytes = fs::read(file)?;
        let absolute = file.to_str().ok_or("an asset path is not UTF-8")?;
        writeln!(
            table,
            "    Asset {{ path: {name:?}, body: include_bytes!({absolute:?}), etag: \"\\\"{:016x}\\\"\" }},",
            fnv1a(&bytes)
        )?;
    }
    table.push(']');
    let out = PathBuf::from(env::var("OUT_DIR")?).join("assets.rs");
    fs::write(out, table)?;
    Ok(())
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), Box<dyn Error>> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, files)?;
        } else {
            files.push(path);
        }
    }
    Ok(())
}

/// 64-bit FNV-1a: enough to tell one build of a file from another.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
