//! tenancy-accounting: what slurm-tenancy's audit logs say, for the admin and the auditor. The
//! logs themselves (records, the hash chain, appends, anchors) are tenancy-audit-log's.
//!
//! * [`report`]: usage and incident figures (`tenancyctl report`);
//! * [`statement`]: the priced monthly statement per tenant (`tenancyctl report --statement`);
//! * [`sacct`]: the logs against Slurm's own accounting (`tenancyctl report --compare-sacct`);
//! * [`verify`]: every node's hash chain checked against the anchors (`tenancyctl audit
//!   verify`).

pub mod report;
pub mod sacct;
pub mod statement;
pub mod verify;

use std::path::PathBuf;

pub use verify::{verify_paths, Finding, FindingKind, VerifyReport};

/// How this crate's writers lay their rows out: an aligned table, CSV or JSON (tenancyctl's
/// `--format` picks one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Render {
    #[default]
    Table,
    Csv,
    Json,
}

/// Calls `line` with each line of the audit logs at `paths` (folders expanded as
/// [`expand_paths`] does), one buffer reused throughout.
pub fn for_each_line(paths: &[PathBuf], mut line: impl FnMut(&[u8])) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::BufRead;
    let mut buf = Vec::new();
    for f in expand_paths(paths)? {
        let file = std::fs::File::open(&f)
            .with_context(|| format!("opening audit log {}", f.display()))?;
        let mut rd = std::io::BufReader::new(file);
        loop {
            buf.clear();
            if rd.read_until(b'\n', &mut buf)? == 0 {
                break;
            }
            line(&buf);
        }
    }
    Ok(())
}

/// Expands folders into their regular, non-hidden files (sorted; symlinks inside folders and
/// `*.lock` files skipped). Explicit file arguments are kept as given.
pub fn expand_paths(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    use anyhow::Context;
    let mut out = Vec::new();
    for p in paths {
        let meta =
            std::fs::metadata(p).with_context(|| format!("audit log path {}", p.display()))?;
        if meta.is_dir() {
            let mut v = Vec::new();
            for e in std::fs::read_dir(p).with_context(|| format!("listing {}", p.display()))? {
                let e = e?;
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.starts_with('.') || name.ends_with(".lock") {
                    continue;
                }
                if e.file_type()?.is_file() {
                    v.push(e.path());
                }
            }
            v.sort();
            out.extend(v);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}
