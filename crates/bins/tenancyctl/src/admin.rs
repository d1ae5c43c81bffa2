//! Administrators' actions in the audit trail (PCI DSS 10.2.1.2, 10.2.2): every
//! state-changing `tenancyctl` command appends an `admin_action` record with who ran it (uid
//! and user), the command line and its outcome, anchored as every record is.

use std::process::ExitCode;

use tenancy_audit_log::{AuditLog, Event, Outcome, Record};
use tenancy_config::Config;

/// The node name the audit records of this node carry: the log's own (the name the prolog
/// got from slurmd), else the host's short name.
pub fn node_name(config: &Config) -> String {
    if let Ok(log) = std::fs::symlink_metadata(&config.cluster.audit_log)
        .ok()
        .filter(|m| m.is_file())
        .map(|_| AuditLog::open(&config.cluster.audit_log))
        .transpose()
    {
        if let Some(node) = log.and_then(|l| l.head().ok()).and_then(|h| h.node) {
            return node;
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().split('.').next().unwrap_or_default().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The command line as typed, each word as the shell would need it quoted.
pub fn command_line() -> String {
    let words: Vec<String> = std::env::args_os()
        .enumerate()
        .map(|(i, a)| {
            let a = a.to_string_lossy().into_owned();
            let a = if i == 0 { "tenancyctl".to_string() } else { a };
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@+".contains(&b))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect();
    words.join(" ")
}

/// A record of this node by the operator, stamped now.
pub fn record(config: &Config, event: Event, outcome: Outcome) -> Record {
    let (user, uid) = crate::reconcile::operator();
    Record::new(
        config.cluster.name.clone(),
        node_name(config),
        user,
        uid,
        event,
        outcome,
        "tenancyctl",
    )
}

/// Records that the admin ran this command with `result`; a record that cannot be written
/// turns a success into a failure (exit 2), since the action is then outside the trail.
pub fn audited(config: &Config, result: anyhow::Result<ExitCode>) -> anyhow::Result<ExitCode> {
    let (outcome, reason) = match &result {
        Ok(c) if *c == ExitCode::SUCCESS => (Outcome::Success, "exit 0".to_string()),
        Ok(c) => (Outcome::Failure, format!("exit {}", exit_number(*c))),
        Err(e) => (Outcome::Failure, format!("error: {e:#}")),
    };
    let mut rec = record(config, Event::AdminAction, outcome)
        .command(command_line())
        .reason(reason);
    match tenancy_job::audit::append_anchored(config, &mut rec) {
        Ok(_) => result,
        Err(e) => {
            eprintln!("tenancyctl: this action is not in the audit trail: {e}");
            match result {
                Ok(c) if c == ExitCode::SUCCESS => Ok(ExitCode::from(2)),
                other => other,
            }
        }
    }
}

/// ExitCode hides its number; the codes tenancyctl uses are 0, 1 and 2.
fn exit_number(c: ExitCode) -> u8 {
    if c == ExitCode::SUCCESS {
        0
    } else if c == ExitCode::FAILURE {
        1
    } else {
        2
    }
}
