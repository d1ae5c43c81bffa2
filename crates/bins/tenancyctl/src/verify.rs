//! `tenancyctl audit verify`: its arguments, and tenancy-accounting's verdict on every node's
//! hash chain printed as a table, CSV or JSON.

use crate::output::Format;
use std::path::PathBuf;
use std::process::ExitCode;
use tenancy_accounting::verify::{read_anchors, verify_paths, VerifyReport};

/// `tenancyctl audit verify`.
#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// Anchor file(s) or syslog file(s) with `node=.. seq=.. hash=..` lines; every anchor is
    /// checked against the record with its seq, and the newest per node detects a cut-off tail.
    #[arg(long = "anchor", value_name = "FILE")]
    pub anchors: Vec<PathBuf>,
    /// Take only anchors whose MAC this key (cluster.audit_anchor_key) holds; others are
    /// counted and left out. Default with --anchor: the config's key, when it names one.
    #[arg(long, value_name = "FILE")]
    pub anchor_key: Option<PathBuf>,
    /// The nodes' public keys, one line per node and key (`<node> ed25519 <hex>`, as
    /// `tenancyctl audit keygen` prints it): take anchors signed by a key of the node they
    /// name; with --anchor-key too, also anchors with a valid MAC alone from before the node
    /// signed (logs written before). Default with --anchor: the config's audit.public_keys.
    #[arg(long, value_name = "FILE")]
    pub public_keys: Option<PathBuf>,
    /// A node whose anchors say its clock was not synchronised is a finding, not a note.
    #[arg(long)]
    pub require_clock_sync: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Stop listing findings after this many (all are still counted).
    #[arg(long, default_value_t = 1000)]
    pub max_findings: usize,
    /// The paths hold every node's log: a node an anchor names with no log among them is a
    /// finding (its log was deleted or lost), not a note. Without it the inputs may be a few
    /// nodes' logs.
    #[arg(long)]
    pub all_nodes: bool,
    /// Per-node audit log files, or folders of them.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

/// Runs `audit verify`: exit 0 when every chain is intact, 1 on any finding.
pub fn run_verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let anchors = read_anchors(
        &args.anchors,
        args.anchor_key.as_deref(),
        args.public_keys.as_deref(),
    )?;
    let mut report = verify_paths(&args.paths, &anchors, args.max_findings)?;
    if args.all_nodes {
        report.require_every_anchored_node(&anchors, args.max_findings);
    }
    if args.require_clock_sync {
        report.require_clock_sync(args.max_findings);
    }
    let mut out = std::io::stdout().lock();
    write_verify(&mut out, &report, args.format)?;
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn write_verify(
    out: &mut dyn std::io::Write,
    r: &VerifyReport,
    format: Format,
) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, r)?;
            writeln!(out)?;
        }
        Format::Csv => {
            let mut w = csv::Writer::from_writer(out);
            w.write_record(["node", "file", "line", "seq", "kind", "detail"])?;
            for f in &r.findings {
                let kind = serde_json::to_value(&f.kind)?;
                let kind = kind["kind"].as_str().unwrap_or("").to_string();
                w.write_record([
                    f.node.clone(),
                    f.file.display().to_string(),
                    f.line.to_string(),
                    f.seq.map(|s| s.to_string()).unwrap_or_default(),
                    kind,
                    f.to_string(),
                ])?;
            }
            w.flush()?;
        }
        Format::Table => {
            for n in &r.nodes {
                writeln!(
                    out,
                    "{}/{}: {} records, last seq {}, head {}, anchor {}: {}",
                    n.cluster,
                    n.node,
                    n.records,
                    n.last_seq,
                    &n.head_hash[..16],
                    n.anchor_seq
                        .map(|s| format!("seq {s}"))
                        .unwrap_or_else(|| "none".into()),
                    if n.findings == 0 {
                        "OK".to_string()
                    } else {
                        format!("{} finding(s)", n.findings)
                    }
                )?;
            }
            for f in &r.findings {
                writeln!(out, "FINDING {f}")?;
            }
            for n in r.nodes.iter().filter(|n| n.first_seq > 1) {
                writeln!(
                    out,
                    "NOTE node {}/{}: the chain begins at seq {} ({}); the files before it were \
                     not given, so the records before it{} are not checked",
                    n.cluster,
                    n.node,
                    n.first_seq,
                    n.continues.as_deref().unwrap_or("log_continued"),
                    if n.anchors_before_first > 0 {
                        format!(" and {} anchor(s) of them", n.anchors_before_first)
                    } else {
                        String::new()
                    }
                )?;
            }
            if r.unauthenticated_anchors > 0 {
                writeln!(
                    out,
                    "NOTE {} anchor line(s) without a valid {} left out (first: {}): written \
                     without the node's key, as any local user can write to syslog",
                    r.unauthenticated_anchors,
                    if r.anchors_signed {
                        "signature or MAC"
                    } else {
                        "MAC"
                    },
                    r.first_unauthenticated_anchor.as_deref().unwrap_or("?")
                )?;
            }
            if r.anchors_signed {
                writeln!(
                    out,
                    "NOTE anchors checked with the nodes' public keys: {} signed{}",
                    r.signed_anchors,
                    if r.mac_anchors > 0 {
                        format!(
                            ", {} by their MAC alone (written before the node signed)",
                            r.mac_anchors
                        )
                    } else {
                        String::new()
                    }
                )?;
            }
            if r.bad_signatures > 0 {
                writeln!(
                    out,
                    "NOTE {} anchor line(s) whose signature does not hold, or by a key in no line \
                     of the public keys file, left out (first: {})",
                    r.bad_signatures,
                    r.first_bad_signature.as_deref().unwrap_or("?")
                )?;
            }
            if r.foreign_signatures > 0 {
                writeln!(
                    out,
                    "WARNING {} anchor line(s) signed by another node's key than the node they \
                     name, left out: root on that node wrote them (first: {})",
                    r.foreign_signatures,
                    r.first_foreign_signature.as_deref().unwrap_or("?")
                )?;
            }
            if r.mac_after_signing > 0 {
                writeln!(
                    out,
                    "NOTE {} anchor line(s) with a MAC alone, at or after their node's first \
                     signed anchor, left out: the HMAC key is on every node",
                    r.mac_after_signing
                )?;
            }
            for u in &r.unsynchronised {
                writeln!(
                    out,
                    "WARNING node {}: its clock was not synchronised: {} anchor(s) from seq {} to \
                     {} say so (estimated error up to {} ms; first: {}), {} say it was: the \
                     times of its records then cannot be trusted (PCI DSS 10.6)",
                    u.node,
                    u.anchors,
                    u.first_seq,
                    u.last_seq,
                    u.max_esterror_us / 1000,
                    u.first_anchor,
                    u.synced_anchors
                )?;
            }
            for n in r.nodes.iter().filter(|n| n.duplicates > 0) {
                writeln!(
                    out,
                    "NOTE node {}/{}: {} exact copies of records skipped (at-least-once delivery)",
                    n.cluster, n.node, n.duplicates
                )?;
            }
            for n in &r.anchored_nodes_without_log {
                writeln!(
                    out,
                    "NOTE node {n}: anchored but no log among the inputs (not given, or deleted)"
                )?;
            }
            if r.is_clean() {
                writeln!(out, "verify: all chains intact")?;
            } else {
                writeln!(
                    out,
                    "verify: {} finding(s); first: {}",
                    r.total_findings,
                    r.first().map(|f| f.to_string()).unwrap_or_default()
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenancy_test_support::audit_logs::{lines, make_log, write_lines};

    #[test]
    fn run_verify_exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        let p = make_log(dir.path(), 4);
        let args = VerifyArgs {
            anchors: vec![],
            anchor_key: None,
            public_keys: None,
            require_clock_sync: false,
            format: Format::Json,
            max_findings: 10,
            all_nodes: false,
            paths: vec![dir.path().to_path_buf()],
        };
        assert_eq!(
            run_verify(args.clone()).unwrap(),
            std::process::ExitCode::SUCCESS
        );
        let mut ls = lines(&p);
        ls.pop();
        ls.remove(1);
        write_lines(&p, &ls);
        assert_eq!(run_verify(args).unwrap(), std::process::ExitCode::from(1));
    }
}
