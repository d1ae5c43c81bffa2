//! The audit append every product process shares: the record into the node's chain, and the
//! chain head anchored outside it.

use tenancy_audit_log::{AuditLog, Event, Record};
use tenancy_config::Config;

/// Appends `rec` to the node's audit log and anchors the new chain head outside the log
/// (syslog, and `cluster.audit_anchor` when set), but for a `job_start`, whose job's `job_end`
/// anchors a head past it (one send less on every job's start). Every other record is
/// anchored itself (refusals, rollbacks, teardown failures, sessions, reconcile actions), so
/// cutting it off before the next job end shows. The anchor is extra evidence: its absence is
/// reported by `audit verify`, not fatal here.
pub fn append_anchored(
    config: &Config,
    rec: &mut Record,
) -> Result<tenancy_audit_log::Appended, String> {
    let appended = AuditLog::open(&config.cluster.audit_log)
        .and_then(|mut log| log.append(rec))
        .map_err(|e| e.to_string())?;
    if rec.event != Event::JobStart {
        anchor(config, &rec.node, &appended);
    }
    Ok(appended)
}

/// Anchors a chain head (syslog, `cluster.audit_anchor`), with its MAC when
/// `cluster.audit_anchor_key` is set. A key that cannot be read sends the anchor without one,
/// which an authenticating verify leaves out: `tenancyctl doctor` fails on such a key.
pub fn anchor(
    config: &Config,
    node: &str,
    head: &tenancy_audit_log::Appended,
) -> tenancy_audit_log::AnchorStatus {
    let key = config
        .cluster
        .audit_anchor_key
        .as_deref()
        .and_then(|k| tenancy_audit_log::AnchorKey::load(k).ok());
    tenancy_audit_log::send_anchor(
        node,
        head.seq,
        &head.hash,
        config.cluster.audit_anchor.as_deref(),
        key.as_ref(),
    )
}
