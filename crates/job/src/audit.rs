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

/// Anchors a chain head (syslog, `cluster.audit_anchor`), signed with this node's key
/// (`[audit] signing_key`, when the file is there) and with its MAC when
/// `cluster.audit_anchor_key` is set. A key that cannot be read sends the anchor without what
/// it would give, which a verify that checks it leaves out: `tenancyctl doctor` fails on such
/// a key.
pub fn anchor(
    config: &Config,
    node: &str,
    head: &tenancy_audit_log::Appended,
) -> tenancy_audit_log::AnchorStatus {
    anchor_with(config, node, head, None)
}

/// [`anchor`], signed with `node_key` instead of the one in `[audit] signing_key` (key
/// rotation: the old key signs the anchor of the record that names the new one).
pub fn anchor_with(
    config: &Config,
    node: &str,
    head: &tenancy_audit_log::Appended,
    node_key: Option<&tenancy_audit_log::NodeKey>,
) -> tenancy_audit_log::AnchorStatus {
    let mac = config
        .cluster
        .audit_anchor_key
        .as_deref()
        .and_then(|k| tenancy_audit_log::AnchorKey::load(k).ok());
    let loaded = match node_key {
        Some(_) => None,
        None => tenancy_audit_log::NodeKey::load(&config.audit.signing_key).ok(),
    };
    let auth = tenancy_audit_log::AnchorAuth {
        mac: mac.as_ref(),
        node_key: node_key.or(loaded.as_ref()),
    };
    tenancy_audit_log::send_anchor_auth(
        std::path::Path::new(tenancy_audit_log::anchor::DEV_LOG),
        node,
        head.seq,
        &head.hash,
        config.cluster.audit_anchor.as_deref(),
        &auth,
    )
}
