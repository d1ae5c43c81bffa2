//! `tenancyctl adopt`: the PAM side of ssh sessions that pam_slurm_adopt puts into a job (see
//! `tenancy_node::adopt`). Meant for `pam_exec` in the session phase, after pam_slurm_adopt:
//!
//!     account  required  pam_slurm_adopt.so
//!     session  required  pam_exec.so /usr/local/bin/tenancyctl adopt
//!
//! pam_exec runs it as root with PAM_USER and PAM_TYPE set, as a child of the process that
//! becomes the session (its parent, moved by default), and with the PAM environment, where
//! pam_slurm_adopt left SLURM_JOB_ID. Exit 0: joined, or not in a job; exit 1: refused, and with
//! `required` PAM ends the session.

use std::process::ExitCode;
use tenancy_audit::{AuditLog, Event, Outcome, Record};
use tenancy_config::{user_uid, Config};
use tenancy_node::adopt::{adopt, Adopted, Refused};

#[derive(clap::Args)]
pub struct AdoptArgs {
    /// Process to move (default: this command's parent, the session pam_exec runs for)
    #[arg(long)]
    pub pid: Option<i32>,
    /// The session's user (default: PAM_USER)
    #[arg(long)]
    pub user: Option<String>,
}

pub fn run(config: &Config, args: &AdoptArgs) -> anyhow::Result<ExitCode> {
    // pam_exec in the session phase also runs at close_session: nothing to do then.
    if std::env::var("PAM_TYPE").is_ok_and(|t| t != "open_session") {
        return Ok(ExitCode::SUCCESS);
    }
    let Some(user) = args.user.clone().or_else(|| std::env::var("PAM_USER").ok()) else {
        anyhow::bail!("no user: give --user, or run under pam_exec (PAM_USER)");
    };
    let pid = args
        .pid
        .unwrap_or_else(|| std::os::unix::process::parent_id() as i32);
    let refuse = |job: Option<u64>, node: Option<String>, why: String, uid: u32| {
        eprintln!("tenancy: refusing the session of {user} (process {pid}): {why}");
        // A refusal inside a job is a tenancy event; its record is best effort (the session
        // is refused either way).
        if let Some(job) = job {
            let node = node.unwrap_or_else(|| this_node(config));
            let rec = record(
                config,
                &node,
                &user,
                uid,
                "session_refused",
                Outcome::Denied,
            )
            .job_id(job)
            .reason(format!("ssh session process {pid}: {why}"));
            if let Err(e) = append(config, rec) {
                eprintln!("tenancy: the session_refused record was not written: {e}");
            }
        }
        Ok(ExitCode::FAILURE)
    };
    let Some(uid) = user_uid(&user) else {
        return refuse(None, None, format!("user {user} is not in NSS"), u32::MAX);
    };
    // pam_slurm_adopt puts the job it adopted the session into in the PAM environment, which
    // pam_exec passes on.
    let claimed = match std::env::var("SLURM_JOB_ID") {
        Err(_) => None,
        Ok(v) => match v.parse::<u64>() {
            Ok(j) => Some(j),
            Err(_) => {
                return refuse(
                    None,
                    None,
                    format!("SLURM_JOB_ID {v:?} is not a job id"),
                    uid,
                )
            }
        },
    };
    match adopt(config, pid, uid, claimed, tenancy_devices::job::PRODUCT_DIR) {
        Ok(Adopted::NotInJob) => {
            println!(
                "tenancy: session process {pid} of {user} is in no Slurm job: nothing to isolate"
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(Adopted::Joined {
            job,
            tenant,
            tier,
            node,
            ..
        }) => {
            // As no job runs without its job_start, no session joins a job without its record.
            let rec = record(
                config,
                &node,
                &user,
                uid,
                "session_adopted",
                Outcome::Success,
            )
            .job_id(job)
            .tenant(tenant.clone())
            .tier(tier)
            .reason(format!(
                "ssh session process {pid} joined the job's isolation"
            ));
            if let Err(e) = append(config, rec) {
                let why = format!("its audit record cannot be written: {e}");
                return refuse(Some(job), Some(node), why, uid);
            }
            println!(
                "tenancy: session process {pid} of {user} joined the isolation of job {job} \
                 (tenant {tenant})"
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(Refused { job, node, reason }) => refuse(job, node, reason, uid),
    }
}

fn record(
    config: &Config,
    node: &str,
    user: &str,
    uid: u32,
    event: &str,
    outcome: Outcome,
) -> Record {
    Record::new(
        config.cluster.name.clone(),
        node,
        user,
        uid,
        Event::Other(event.into()),
        outcome,
        "tenancyctl",
    )
}

fn append(config: &Config, mut rec: Record) -> Result<(), String> {
    AuditLog::open(&config.cluster.audit_log)
        .and_then(|mut log| log.append(&mut rec))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The node name this node's audit chain uses: that of the log's last record (the prolog
/// writes SLURMD_NODENAME, which need not be the host name), else the short host name.
fn this_node(config: &Config) -> String {
    AuditLog::open(&config.cluster.audit_log)
        .and_then(|log| log.head())
        .ok()
        .and_then(|h| h.node)
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .and_then(|h| h.trim().split('.').next().map(String::from))
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into())
        })
}
