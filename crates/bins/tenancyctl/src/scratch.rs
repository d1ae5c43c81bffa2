//! `tenancyctl scratch unlock|lock JOB`: a retained encrypted scratch folder made readable
//! again, or locked again (docs/encrypted-scratch.md).
//!
//! A retain tier's encrypted folder is locked at job end (its key removed from the file
//! system); its key is kept sealed under the node key in the state folder until the folder
//! expires. `unlock` unseals it and adds it to the file system (root only: the node key is
//! root's), `lock` removes it again. Each folder acted on is an audit record
//! (`scratch_unlocked`, `scratch_locked`), refusals and failures too.

use crate::output::Format;
use anyhow::bail;
use serde::Serialize;
use std::process::ExitCode;
use tenancy_audit_log::{Event, Outcome, Record, Resource, ResourceAction};
use tenancy_config::Config;
use tenancy_scratch::{KeyStore, RetainedFolder};

use crate::output::Rows;

#[derive(clap::Args)]
pub struct ScratchArgs {
    #[command(subcommand)]
    command: ScratchCommand,
}

#[derive(clap::Subcommand)]
enum ScratchCommand {
    /// Make a job's retained encrypted scratch readable again: its key, kept sealed under the
    /// node key until retention ends, added to the file system (root only; audited)
    Unlock(JobArgs),
    /// Remove the key of a job's retained encrypted scratch from the file system again
    /// (root only; audited)
    Lock(JobArgs),
}

#[derive(clap::Args)]
struct JobArgs {
    /// The job whose retained scratch it is
    job: u64,
    /// Only the job's folder of this tenant
    #[arg(long)]
    tenant: Option<String>,
    /// This node's Slurm name, for the audit record (default: the host's short name)
    #[arg(long)]
    node: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Serialize)]
struct Row {
    job_id: u64,
    tenant: String,
    folder: String,
    key_id: String,
    result: String,
}

pub fn run(config: &Config, args: &ScratchArgs) -> anyhow::Result<ExitCode> {
    let (unlock, a) = match &args.command {
        ScratchCommand::Unlock(a) => (true, a),
        ScratchCommand::Lock(a) => (false, a),
    };
    let verb = if unlock { "unlock" } else { "lock" };
    let node = match &a.node {
        Some(n) => n.clone(),
        None => crate::reconcile::short_hostname()?,
    };
    let (user, uid) = crate::reconcile::operator();
    let event = Event::Other(format!("scratch_{verb}ed"));
    if uid != 0 {
        // Nothing to record: the audit log is root's, and nothing was touched.
        bail!(
            "scratch {verb}: only root may {verb} a retained scratch (the node key is root's); \
             run it as root on the node"
        );
    }
    let root = &config.cluster.scratch_root;
    let folders = tenancy_scratch::find_retained(root, a.job, a.tenant.as_deref())
        .map_err(|e| anyhow::anyhow!("scratch {verb}: {e}"))?;
    if folders.is_empty() {
        bail!(
            "scratch {verb}: job {} has no retained scratch under {}{} (expired and purged, \
             never retained, or on another node)",
            a.job,
            root.display(),
            a.tenant
                .as_deref()
                .map(|t| format!(" for tenant {t}"))
                .unwrap_or_default()
        );
    }
    let store = KeyStore::new(&config.cluster.state_dir);
    let mut rows = Vec::new();
    let mut failed = false;
    for f in &folders {
        let done = if unlock {
            tenancy_scratch::unlock(root, f, &store).map(|_| "unlocked".to_string())
        } else {
            tenancy_scratch::lock(root, f).map(|r| match r {
                tenancy_scratch::Removal::FilesBusy => {
                    "locked (files in use keep their keys until closed)".to_string()
                }
                _ => "locked".to_string(),
            })
        };
        let (outcome, result) = match done {
            Ok(r) => (Outcome::Success, r),
            Err(e) => {
                failed = true;
                (Outcome::Failure, format!("failed: {e}"))
            }
        };
        let mut rec = record(config, &node, &user, uid, event.clone(), outcome, f, unlock);
        rec = rec.reason(format!("{} {}: {result}", f.path.display(), verb));
        if let Err(e) = tenancy_job::audit::append_anchored(config, &mut rec) {
            failed = true;
            rows.push(row(
                f,
                format!("{result}; the audit record was not written: {e}"),
            ));
            continue;
        }
        rows.push(row(f, result));
    }
    Rows {
        headers: &["job", "tenant", "folder", "key", "result"],
        rows: &rows,
        cells: |r: &Row| {
            vec![
                r.job_id.to_string(),
                r.tenant.clone(),
                r.folder.clone(),
                r.key_id.clone(),
                r.result.clone(),
            ]
        },
    }
    .print(a.format)?;
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn row(f: &RetainedFolder, result: String) -> Row {
    Row {
        job_id: f.job_id,
        tenant: f.tenant.clone(),
        folder: f.path.display().to_string(),
        key_id: f
            .key_id
            .map(|k| k.to_string())
            .unwrap_or_else(|| "-".into()),
        result,
    }
}

#[allow(clippy::too_many_arguments)]
fn record(
    config: &Config,
    node: &str,
    user: &str,
    uid: u32,
    event: Event,
    outcome: Outcome,
    f: &RetainedFolder,
    unlock: bool,
) -> Record {
    let mut res = Resource::new(
        "scratch",
        if unlock {
            ResourceAction::Made
        } else {
            ResourceAction::Removed
        },
        f.path.display().to_string(),
    )
    .detail("retained_at", f.retained_at);
    if let Some(id) = f.key_id {
        res = res.detail("key_id", id.to_string());
    }
    let tier = config.tenants.get(&f.tenant).map(|t| t.tier.clone());
    let mut rec = Record::new(
        config.cluster.name.clone(),
        node,
        user,
        uid,
        event,
        outcome,
        "tenancyctl",
    )
    .job_id(f.job_id)
    .tenant(f.tenant.clone())
    .resource(res);
    if let Some(t) = tier {
        rec = rec.tier(t);
    }
    rec
}
