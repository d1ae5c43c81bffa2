//! tenancy-audit: the tamper-evident per-node audit log of slurm-tenancy.
//!
//! * [`AuditLog::open`] / [`AuditLog::append`]: what `tenancy-prolog`/`tenancy-epilog` call for
//!   every job (flock, chain head read from the tail, one `write(2)` in `O_APPEND`, fsync).
//! * [`anchor_line`] / [`send_anchor`]: copy the chain head to syslog and an anchor file.
//! * [`verify::run_verify`] (`tenancyctl audit verify`) and [`report::run_report`]
//!   (`tenancyctl report`).
//!
//! The hash canonicalization is described in [`record`].

pub use tenancy_audit_log::{anchor, clock, log, record, sign};
pub mod report;
pub mod verify;

use std::path::PathBuf;

pub use anchor::{
    anchor_line, anchor_mac, anchor_text, parse_anchor_line, send_anchor, send_anchor_auth,
    send_anchor_to, Anchor, AnchorAuth, AnchorKey, AnchorSet, AnchorStatus, AnchorTrust,
    NodeAnchors, NodeClock, Origin, ParsedAnchor, SyslogStatus,
};
pub use clock::{clock_sync, ClockSync};
pub use log::{Appended, AuditError, AuditLog, Head, Rotated};
pub use record::{Event, Outcome, Record, Resource, ResourceAction, GENESIS};
pub use report::{run_report, ReportArgs, ReportFormat};
pub use sign::{NodeKey, PublicKeys, SigCheck};
pub use verify::{run_verify, verify_paths, Finding, FindingKind, VerifyArgs, VerifyReport};

pub use tenancy_output::Format;

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
