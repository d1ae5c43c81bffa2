//! Generates seeded per-node audit logs for benchmarks:
//! `gen_logs OUT_DIR TOTAL_RECORDS NODES [SEED]`.

use std::io::Write;

use chrono::{TimeZone, Utc};
use tenancy_test_support::audit_logs as gen;

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        a.len() >= 4,
        "usage: gen_logs OUT_DIR TOTAL_RECORDS NODES [SEED]"
    );
    let dir = std::path::PathBuf::from(&a[1]);
    let total: usize = a[2].parse()?;
    let nodes: usize = a[3].parse()?;
    let seed: u64 = a.get(4).map(|s| s.parse()).transpose()?.unwrap_or(42);
    std::fs::create_dir_all(&dir)?;
    let mut files = (0..nodes)
        .map(|n| {
            Ok(std::io::BufWriter::with_capacity(
                1 << 20,
                std::fs::File::create(dir.join(format!("gpu{n:03}.audit.jsonl")))?,
            ))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    let mut err = None;
    gen::generate(
        seed,
        nodes,
        total / nodes,
        base,
        |n, l| {
            if let Err(e) = files[n].write_all(l) {
                err.get_or_insert(e);
            }
        },
        |_| {},
    );
    if let Some(e) = err {
        return Err(e.into());
    }
    for f in &mut files {
        f.flush()?;
    }
    Ok(())
}
