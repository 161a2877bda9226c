//! Token counting of upstream results by size: what a proxied call costs on
//! top of forwarding when its result is large (counting is linear in the
//! text; the figures are in docs/performance.md).

// A benchmark whose setup is broken should stop loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use foldgate_engine::{Encoding, TokenCounter};

const SIZES: [usize; 3] = [1024, 64 * 1024, 1024 * 1024];

/// What a tool that reads files or queries an API returns: source code,
/// prose, log lines and JSON, in turn, until `size` bytes.
fn tool_output(size: usize) -> String {
    let mut text = String::with_capacity(size + 512);
    let mut i = 0u64;
    while text.len() < size {
        // A cheap deterministic spread of numbers and identifiers.
        let n = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        let block = match i % 4 {
            0 => format!(
                "pub fn load_{i}(path: &Path) -> Result<Config, Error> {{\n    let raw = \
                 std::fs::read_to_string(path)?;\n    let cfg: Config = toml::from_str(&raw)?;\n    \
                 ensure!(cfg.retries <= {n}, \"too many retries\");\n    Ok(cfg)\n}}\n\n"
            ),
            1 => format!(
                "The gateway forwards call {i} to the upstream and counts its result before the \
                 agent sees it; a result that would overrun the branch's budget is cut at the \
                 budget ({n} tokens left), marked, and the branch is returned.\n\n"
            ),
            2 => format!(
                "2026-11-24T06:{:02}:{:02}.{n:06}Z INFO request_id=req-{n:x} path=/v2/items/{i} \
                 status=200 duration_ms={}\n",
                i % 60,
                n % 60,
                n % 997
            ),
            _ => format!(
                "{{\"id\":{i},\"name\":\"item-{n:x}\",\"tags\":[\"alpha\",\"beta\"],\"price\":{}.{:02},\
                 \"in_stock\":{}}}\n",
                n % 1000,
                n % 100,
                n.is_multiple_of(2)
            ),
        };
        text.push_str(&block);
        i += 1;
    }
    let mut cut = size;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text
}

fn counting(c: &mut Criterion) {
    for (name, encoding) in [("o200k", Encoding::O200kBase), ("cl100k", Encoding::Cl100kBase)] {
        let counter = TokenCounter::new(encoding).unwrap();
        let mut group = c.benchmark_group(format!("count_{name}"));
        group.sample_size(20);
        for size in SIZES {
            let text = tool_output(size);
            let label = format!("{} KiB", size / 1024);
            println!("{name}, {label}: {} tokens", counter.count(&text));
            group.throughput(Throughput::Bytes(text.len() as u64));
            group.bench_with_input(BenchmarkId::from_parameter(&label), &text, |b, text| {
                b.iter(|| counter.count(black_box(text)));
            });
        }
        group.finish();
    }
}

criterion_group!(benches, counting);
criterion_main!(benches);
