//! `tenancyctl audit rotate`: sets the node's audit log aside under a dated name and starts the
//! next file of its chain (tenancy_audit_log::AuditLog::rotate). logrotate's `create` or
//! `copytruncate` would start a new chain at seq 1, which `audit verify` cannot tell from a
//! log whose records were deleted, and whose anchors then contradict the new records.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tenancy_audit_log::AuditLog;
use tenancy_config::Config;

#[derive(Debug, clap::Args)]
pub struct RotateArgs {
    /// The log to rotate (default: the config's cluster.audit_log)
    #[arg(long, value_name = "PATH")]
    pub log: Option<PathBuf>,
}

pub fn run(config: anyhow::Result<Config>, args: &RotateArgs) -> anyhow::Result<ExitCode> {
    let path = match (&args.log, &config) {
        (Some(p), _) => p.clone(),
        (None, Ok(c)) => c.cluster.audit_log.clone(),
        (None, Err(e)) => anyhow::bail!("{e}; or name the log with --log PATH"),
    };
    // Opening creates the log: a path with no log (a typo) is answered, not made.
    if let Err(e) = path.symlink_metadata() {
        if e.kind() == std::io::ErrorKind::NotFound {
            println!("{}: absent or empty, nothing to rotate", path.display());
            return Ok(ExitCode::SUCCESS);
        }
    }
    let (user, uid) = crate::reconcile::operator();
    let mut log = AuditLog::open(&path)?;
    let Some(r) = log
        .rotate(&user, uid, "tenancyctl")
        .with_context(|| format!("rotating {}", path.display()))?
    else {
        println!("{}: absent or empty, nothing to rotate", path.display());
        return Ok(ExitCode::SUCCESS);
    };
    // The new head is anchored as every record's (the log_rotated one is behind it), where
    // the config says; without a config, to syslog alone.
    let sent = match &config {
        Ok(c) => tenancy_job::audit::anchor(c, &r.node, &r.head),
        Err(_) => tenancy_audit_log::send_anchor(&r.node, r.head.seq, &r.head.hash, None, None),
    };
    println!(
        "{}: kept as {} (its last record seq {}, log_rotated); the chain goes on at seq {} \
         (log_continued) in {}",
        path.display(),
        r.kept_as.display(),
        r.rotated_seq,
        r.head.seq,
        path.display()
    );
    if let tenancy_audit_log::SyslogStatus::Unavailable(why) = &sent.syslog {
        eprintln!("tenancyctl: the new head was not anchored to syslog: {why}");
    }
    if let Some(Err(why)) = &sent.file {
        eprintln!("tenancyctl: the new head was not anchored: {why}");
    }
    Ok(ExitCode::SUCCESS)
}
