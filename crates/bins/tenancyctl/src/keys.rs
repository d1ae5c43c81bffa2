//! `tenancyctl audit keygen`: this node's Ed25519 key that signs its anchors. The private key
//! stays on the node, root's alone (`[audit] signing_key`, mode 0600); the public key's line
//! goes into the file of the nodes' public keys that `audit verify --public-keys` reads. A
//! rotation is a `key_rotated` record whose anchor the old key signs, so the old key vouches
//! for the new one; the old public key keeps verifying the anchors it signed.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use tenancy_audit_log::{Event, NodeKey, Outcome, Resource, ResourceAction};
use tenancy_config::Config;

#[derive(Debug, clap::Args)]
pub struct KeygenArgs {
    /// Replace the node's key with a new one (the old one signs the record of the change)
    #[arg(long)]
    pub rotate: bool,
    /// Do nothing when the node has a key already (packages run this at install)
    #[arg(long, conflicts_with = "rotate")]
    pub if_missing: bool,
}

fn key_resource(action: ResourceAction, key: &NodeKey, path: &std::path::Path) -> Resource {
    Resource::new("audit", action, format!("ed25519:{}", key.id()))
        .detail("public_key", hex_public(key))
        .detail("path", path.display().to_string())
}

fn hex_public(key: &NodeKey) -> String {
    let line = key.public_line("x");
    line.rsplit(' ').next().unwrap_or_default().to_string()
}

pub fn run(config: &Config, args: &KeygenArgs) -> anyhow::Result<ExitCode> {
    let path = config.audit.signing_key.clone();
    let node = crate::admin::node_name(config);
    let exists = path.symlink_metadata().is_ok();
    if exists && args.if_missing {
        let key = NodeKey::load(&path).map_err(anyhow::Error::msg)?;
        println!("{}", key.public_line(&node));
        return Ok(ExitCode::SUCCESS);
    }
    if exists && !args.rotate {
        bail!(
            "{} exists: this node has a signing key already (--rotate replaces it)",
            path.display()
        );
    }
    if !exists && args.rotate {
        bail!(
            "{} does not exist: nothing to rotate (run without --rotate)",
            path.display()
        );
    }
    let new = NodeKey::generate().context("no random numbers from the kernel")?;
    let old = if args.rotate {
        Some(NodeKey::load(&path).map_err(|e| {
            anyhow::anyhow!("{e}; the old key must sign its successor's record: fix it first")
        })?)
    } else {
        None
    };
    // The new key is made whole under a hidden name, then renamed into place after its record.
    let tmp = match (path.parent(), path.file_name()) {
        (Some(d), Some(n)) => d.join(format!(".{}.new", n.to_string_lossy())),
        _ => bail!(
            "audit.signing_key {} names no file in a folder",
            path.display()
        ),
    };
    let _ = std::fs::remove_file(&tmp);
    new.write_new(&tmp).map_err(anyhow::Error::msg)?;
    let mut rec = match &old {
        None => crate::admin::record(config, Event::KeyGenerated, Outcome::Success)
            .reason(format!(
                "this node's anchors are signed with Ed25519 key {}",
                new.id()
            ))
            .resource(key_resource(ResourceAction::Made, &new, &path)),
        Some(o) => crate::admin::record(config, Event::KeyRotated, Outcome::Success)
            .reason(format!(
                "key {} replaced by {}: anchors up to this record are signed by the old key, \
                 after it by the new one",
                o.id(),
                new.id()
            ))
            .resource(key_resource(ResourceAction::Removed, o, &path))
            .resource(key_resource(ResourceAction::Made, &new, &path)),
    };
    let appended = match tenancy_audit_log::AuditLog::open(&config.cluster.audit_log)
        .and_then(|mut l| l.append(&mut rec))
    {
        Ok(a) => a,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            bail!("the key's record cannot be written, so no key was made: {e}");
        }
    };
    // The old key vouches for the new one; then the new key signs the same head.
    if let Some(o) = &old {
        tenancy_job::audit::anchor_with(config, &node, &appended, Some(o));
    }
    std::fs::rename(&tmp, &path)
        .and_then(|()| match path.parent() {
            Some(d) => std::fs::File::open(d).and_then(|d| d.sync_all()),
            None => Ok(()),
        })
        .with_context(|| format!("putting the new key in place at {}", path.display()))?;
    tenancy_job::audit::anchor_with(config, &node, &appended, Some(&new));
    let line = new.public_line(&node);
    let pub_path = PathBuf::from(format!("{}.pub", path.display()));
    if let Err(e) = std::fs::write(&pub_path, format!("{line}\n")) {
        eprintln!("tenancyctl: cannot write {}: {e}", pub_path.display());
    }
    eprintln!(
        "tenancyctl: {} key {} in {} ({} seq {}); add this line to the nodes' public keys \
         file (audit.public_keys){}:",
        if old.is_some() { "rotated to" } else { "made" },
        new.id(),
        path.display(),
        rec.event,
        appended.seq,
        if old.is_some() {
            ", keeping the old key's line: it verifies the anchors it signed"
        } else {
            ""
        }
    );
    println!("{line}");
    Ok(ExitCode::SUCCESS)
}
