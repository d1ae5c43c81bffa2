//! The product's own state on the node: its folders, the intent log, the audit trail's keys,
//! clock and forwarding, the DCGM mapping folder and the scratch root's encryption.

use super::{row, Row};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use tenancy_config::Config;
use tenancy_devices::doctor::Severity;

/// The key that authenticates anchors: without one, any local user's syslog line can pass
/// for an anchor and make `audit verify --anchor` report a cut or rewritten log; a key set
/// but unreadable leaves this node's anchors without the MAC the verify with the key wants.
fn anchor_key_row(key: Option<&Path>) -> Row {
    let make = "head -c 32 /dev/urandom > /etc/slurm/tenancy-anchor.key && chmod 600 \
                /etc/slurm/tenancy-anchor.key, the same file on every node and with the \
                auditor, and cluster.audit_anchor_key = that path";
    match key.map(tenancy_audit_log::AnchorKey::load) {
        None => row(
            "audit.anchor_key",
            Severity::Warn,
            "cluster.audit_anchor_key is not set: anchors are not authenticated, and any \
             local user can write a line to syslog (logger) that `audit verify --anchor` \
             takes for an anchor and reports as a cut or rewritten log"
                .into(),
            Some(make.into()),
        ),
        Some(Ok(_)) => row(
            "audit.anchor_key",
            Severity::Ok,
            format!(
                "anchors carry the HMAC of {}",
                key.map(Path::display).unwrap()
            ),
            None,
        ),
        Some(Err(e)) => row(
            "audit.anchor_key",
            Severity::Error,
            format!("{e}: this node's anchors go out without their MAC, and a verify with the key leaves them out"),
            Some(make.into()),
        ),
    }
}

/// Which key authenticates this node's anchors: its own Ed25519 key (`[audit] signing_key`),
/// which an auditor checks with its public key alone, or only the cluster's shared HMAC key
/// (logs written before keep verifying with it), or none.
fn signing_row(path: &Path, hmac: Option<&Path>) -> Row {
    let make = "tenancyctl audit keygen (and add the line it prints to the nodes' public keys \
                file, audit.public_keys)";
    match tenancy_audit_log::NodeKey::load(path) {
        Ok(k) => row(
            "audit.signing",
            Severity::Ok,
            format!(
                "anchors are signed with this node's Ed25519 key {} ({}){}",
                k.id(),
                path.display(),
                if hmac.is_some() {
                    " and carry the cluster's HMAC too (for verifiers of older logs)"
                } else {
                    ""
                }
            ),
            None,
        ),
        Err(_) if !path.exists() => row(
            "audit.signing",
            Severity::Warn,
            format!(
                "no signing key at {}: anchors carry {}; root on any node can forge them, and \
                 whoever verifies needs the secret",
                path.display(),
                if hmac.is_some() {
                    "the cluster's shared HMAC alone"
                } else {
                    "no signature and no MAC"
                }
            ),
            Some(make.into()),
        ),
        Err(e) => row(
            "audit.signing",
            Severity::Error,
            format!("{e}: this node's anchors go out unsigned"),
            Some(make.into()),
        ),
    }
}

/// The clock every record's time comes from (adjtimex): anchors say whether it was
/// synchronised, and `audit verify` reports a node whose anchors say it was not.
fn clock_row(c: Option<tenancy_audit_log::ClockSync>) -> Row {
    match c {
        Some(c) if c.synchronised => row(
            "audit.clock",
            Severity::Ok,
            format!(
                "the clock is synchronised (estimated error {} µs)",
                c.esterror_us
            ),
            None,
        ),
        Some(c) => row(
            "audit.clock",
            Severity::Warn,
            format!(
                "the kernel says the clock is not synchronised (adjtimex: TIME_ERROR or \
                 STA_UNSYNC; estimated error {} ms): record times cannot be trusted, and \
                 every anchor says so (PCI DSS 10.6)",
                c.esterror_us / 1000
            ),
            Some("run a time service (chrony, ntpsec, systemd-timesyncd) against the site's time sources".into()),
        ),
        None => row(
            "audit.clock",
            Severity::Warn,
            "adjtimex refused: the clock's state is unknown, and anchors say so".into(),
            None,
        ),
    }
}

/// Whether records leave the node: `[audit] collectors` and the forwarder's cursors.
fn forward_row(config: &Config) -> Row {
    if config.audit.collectors.is_empty() {
        return row(
            "audit.forward",
            Severity::Warn,
            "no [audit] collectors: the records stay on this node, where its root can remove \
             them (PCI DSS 10.3.3 asks for a copy on a separate log server)"
                .into(),
            Some(
                "set [audit] collectors and ca_file, and enable tenancy-audit-forward.service"
                    .into(),
            ),
        );
    }
    let mut notes = Vec::new();
    for c in &config.audit.collectors {
        match crate::forward::read_cursor(&crate::forward::cursor_path(config, c)) {
            Ok(Some(cur)) => notes.push(format!(
                "{c}: confirmed up to seq {}{}",
                cur.record.seq,
                cur.last_error
                    .as_deref()
                    .filter(|_| !cur.connected)
                    .map(|e| format!(", last error: {e}"))
                    .unwrap_or_default()
            )),
            Ok(None) => notes.push(format!("{c}: nothing forwarded yet")),
            Err(e) => notes.push(e),
        }
    }
    row(
        "audit.forward",
        Severity::Ok,
        format!("records are forwarded: {}", notes.join("; ")),
        None,
    )
}

fn root_owned_dir(path: &Path, what: &str, out: &mut Vec<Row>) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0 => out.push(row(
            what,
            Severity::Ok,
            format!(
                "{} is a root-owned folder others cannot write",
                path.display()
            ),
            None,
        )),
        Ok(m) => out.push(row(
            what,
            Severity::Error,
            format!(
                "{} is not a root-owned, non-writable folder (uid {}, mode {:o}, symlink: {})",
                path.display(),
                m.uid(),
                m.mode() & 0o7777,
                m.file_type().is_symlink()
            ),
            Some(format!(
                "chown root:root {0} && chmod go-w {0}",
                path.display()
            )),
        )),
        Err(e) => out.push(row(
            what,
            Severity::Error,
            format!("{}: {e}", path.display()),
            Some(format!("mkdir -p {0} && chmod 755 {0}", path.display())),
        )),
    }
}

/// The intent log: jobs whose intents were recorded before the last restart (a power loss may
/// have taken their journal files) wait for `tenancyctl reconcile --apply`.
fn intent_log_row(state_dir: &Path) -> Row {
    use tenancy_job::intent_log::{boot_id, IntentLog, FILE};
    let path = state_dir.join(FILE);
    let records = match IntentLog::open_existing(state_dir) {
        Ok(None) => {
            return row(
                "state.intent_log",
                Severity::Ok,
                format!(
                    "{}: none yet (the first job's prolog makes it)",
                    path.display()
                ),
                None,
            )
        }
        Ok(Some(log)) => log.records().map(|r| (log.slots(), r)),
        Err(e) => Err(e),
    };
    match records {
        Ok((slots, records)) => {
            let boot = boot_id();
            let earlier: Vec<String> = records
                .iter()
                .filter(|r| boot != Some(r.boot))
                .map(|r| r.job_id.to_string())
                .collect();
            if earlier.is_empty() {
                row(
                    "state.intent_log",
                    Severity::Ok,
                    format!(
                        "{}: {} of {slots} slot(s) held by running jobs",
                        path.display(),
                        records.len()
                    ),
                    None,
                )
            } else {
                row(
                    "state.intent_log",
                    Severity::Warn,
                    format!(
                        "{}: the intents of job(s) {} were recorded before the node restarted \
                         and their resources may be left",
                        path.display(),
                        earlier.join(", ")
                    ),
                    Some("tenancyctl reconcile --apply".into()),
                )
            }
        }
        Err(e) => row(
            "state.intent_log",
            Severity::Error,
            format!("{}: {e}", path.display()),
            Some(format!(
                "check {}; the prolog cannot record intents there",
                path.display()
            )),
        ),
    }
}

/// The product's folders, intent log and audit anchor key.
pub(super) fn state_rows(config: &Config, rows: &mut Vec<Row>) {
    root_owned_dir(&config.cluster.scratch_root, "scratch.root", rows);
    scratch_encryption_rows(config, rows);
    root_owned_dir(&config.cluster.state_dir, "state.dir", rows);
    rows.push(intent_log_row(&config.cluster.state_dir));
    if let Some(dir) = config.cluster.audit_log.parent() {
        root_owned_dir(dir, "audit.dir", rows);
    }
    let signing = tenancy_audit_log::NodeKey::load(&config.audit.signing_key).is_ok();
    // With the node's own key, the shared HMAC key is only for verifiers of older logs.
    if !(signing && config.cluster.audit_anchor_key.is_none()) {
        rows.push(anchor_key_row(config.cluster.audit_anchor_key.as_deref()));
    }
    rows.push(signing_row(
        &config.audit.signing_key,
        config.cluster.audit_anchor_key.as_deref(),
    ));
    rows.push(clock_row(tenancy_audit_log::clock_sync()));
    rows.push(forward_row(config));
    if let Some(dir) = &config.cluster.dcgm_job_mapping_dir {
        rows.push(dcgm_dir_row(dir));
    }
}

/// DCGM exporter's job mapping folder: one a user can write is refused by the prolog (jobs then
/// run unlabelled), as a user could otherwise make the prolog fail there and drain the node.
fn dcgm_dir_row(dir: &Path) -> Row {
    match tenancy_node::layers::dcgm::folder_problem(dir) {
        None => row(
            "dcgm.mapping_dir",
            Severity::Ok,
            format!(
                "{} is root's alone (or made by the first MIG job's prolog, root, 0755)",
                dir.display()
            ),
            None,
        ),
        Some(problem) => row(
            "dcgm.mapping_dir",
            Severity::Error,
            problem,
            Some(format!(
                "chown root:root {0} && chmod 0755 {0} (or unset cluster.dcgm_job_mapping_dir)",
                dir.display()
            )),
        ),
    }
}

/// Per tier, whether its job folders are encrypted on this node's scratch root (a tier that
/// requires it on a file system without fscrypt fails every job at the prolog); the node key
/// of retained encrypted folders, and erased folders still waiting in the trash.
fn scratch_encryption_rows(config: &Config, rows: &mut Vec<Row>) {
    use tenancy_config::{ScratchEncryption, ScratchOnExit};
    let root = &config.cluster.scratch_root;
    let support = tenancy_scratch::encryption_support(root);
    for (name, tier) in &config.tiers {
        rows.push(scratch_tier_row(name, tier.scratch_encryption, &support));
    }
    let retains_encrypted = config.tiers.values().any(|t| {
        t.scratch_encryption == ScratchEncryption::Required
            && t.scratch_on_exit == ScratchOnExit::Retain
    });
    if retains_encrypted {
        rows.push(node_key_row(config));
    }
    match tenancy_scratch::trash::list(root) {
        Ok(entries) if entries.is_empty() => {}
        // (A missing scratch root is scratch.root's row.)
        Err(_) if !root.is_dir() => {}
        Ok(entries) => rows.push(row(
            "scratch.trash",
            Severity::Ok,
            format!(
                "{} erased job folder(s) (keys removed) wait for deletion in {}",
                entries.len(),
                root.join(tenancy_scratch::trash::TRASH_DIR).display()
            ),
            Some("tenancyctl reconcile --apply deletes them now".into()),
        )),
        Err(e) => rows.push(row("scratch.trash", Severity::Error, format!("{e}"), None)),
    }
}

/// Whether tier `name`'s job folders are encrypted (`support`: the scratch root's fscrypt).
fn scratch_tier_row(
    name: &str,
    encryption: tenancy_config::ScratchEncryption,
    support: &Result<String, String>,
) -> Row {
    use tenancy_config::ScratchEncryption;
    let check = format!("scratch.encryption.{name}");
    match (encryption, support) {
        (ScratchEncryption::Required, Ok(fs)) => row(
            &check,
            Severity::Ok,
            format!(
                "tier {name}: each job folder is encrypted with a key of its own ({}) on {fs}",
                tenancy_scratch::fscrypt::POLICY_NAME
            ),
            None,
        ),
        (ScratchEncryption::Required, Err(why)) => row(
            &check,
            Severity::Error,
            format!(
                "tier {name} requires scratch_encryption, and every job of it fails at the prolog: {why}"
            ),
            Some(format!(
                "move cluster.scratch_root to a file system with fscrypt (ext4 made with `mkfs.ext4 -O encrypt`), or set scratch_encryption = \"off\" in [tiers.{name}]"
            )),
        ),
        (ScratchEncryption::Off, Ok(fs)) => row(
            &check,
            Severity::Ok,
            format!(
                "tier {name}: scratch_encryption off, job folders in clear; {fs} supports it (scratch_encryption = \"required\")"
            ),
            None,
        ),
        (ScratchEncryption::Off, Err(why)) => row(
            &check,
            Severity::Ok,
            format!(
                "tier {name}: scratch_encryption off, job folders in clear; it could not be turned on here: {why}"
            ),
            None,
        ),
    }
}

/// The node key that seals the keys of retained encrypted folders: root's alone, 32 bytes.
fn node_key_row(config: &Config) -> Row {
    let store = tenancy_scratch::KeyStore::new(&config.cluster.state_dir);
    let path = store.node_key_path();
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => row(
            "scratch.node_key",
            Severity::Ok,
            format!(
                "{}: none yet (the first retained encrypted job makes it)",
                path.display()
            ),
            None,
        ),
        Ok(m) if m.is_file() && m.uid() == 0 && m.mode() & 0o077 == 0 && m.len() == 32 => {
            row(
                "scratch.node_key",
                Severity::Ok,
                format!(
                    "{}: root's alone; it unseals the keys of retained encrypted folders (back it up with the state folder's care: without it they cannot be unlocked)",
                    path.display()
                ),
                None,
            )
        }
        Ok(m) => row(
            "scratch.node_key",
            Severity::Error,
            format!(
                "{} is not a 32-byte file of root's alone (uid {}, mode {:04o}, {} bytes)",
                path.display(),
                m.uid(),
                m.mode() & 0o7777,
                m.len()
            ),
            Some(format!("chown root {0} && chmod 400 {0}", path.display())),
        ),
        Err(e) => row(
            "scratch.node_key",
            Severity::Error,
            format!("{}: {e}", path.display()),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::anchor_key_row;

    #[test]
    fn anchors_without_a_usable_key_are_warned_or_failed() {
        use std::os::unix::fs::PermissionsExt;
        let none = anchor_key_row(None);
        assert_eq!(none.severity, "warn");
        assert!(none.message.contains("logger"), "{}", none.message);
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("anchor.key");
        std::fs::write(&key, [3u8; 32]).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(anchor_key_row(Some(&key)).severity, "ok");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = anchor_key_row(Some(&key));
        assert_eq!(open.severity, "error");
        assert!(open.message.contains("chmod 600"), "{}", open.message);
        let missing = anchor_key_row(Some(&dir.path().join("none")));
        assert_eq!(missing.severity, "error");
    }
}
