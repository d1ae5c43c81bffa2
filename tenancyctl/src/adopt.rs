//! `tenancyctl adopt`: the PAM side of ssh sessions that pam_slurm_adopt puts into a job (see
//! `tenancy_node::adopt`). Meant for `pam_exec` in the session phase, after pam_slurm_adopt:
//!
//!     account  required  pam_slurm_adopt.so
//!     session  required  pam_exec.so /usr/local/bin/tenancyctl adopt
//!
//! pam_exec runs it as root with PAM_USER and PAM_TYPE set, as a child of the process that
//! becomes the session (its parent, moved by default). Exit 0: joined, or not in a job; exit 1:
//! refused, and with `required` PAM ends the session.

use std::process::ExitCode;
use tenancy_config::{user_uid, Config};
use tenancy_node::adopt::{adopt, Adopted};

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
    let refuse = |why: String| {
        eprintln!("tenancy: refusing the session of {user} (process {pid}): {why}");
        Ok(ExitCode::FAILURE)
    };
    let Some(uid) = user_uid(&user) else {
        return refuse(format!("user {user} is not in NSS"));
    };
    match adopt(config, pid, uid, tenancy_devices::job::PRODUCT_DIR) {
        Ok(Adopted::NotInJob) => {
            println!(
                "tenancy: session process {pid} of {user} is in no Slurm job: nothing to isolate"
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(Adopted::Joined { job, env }) => {
            let tenant = env
                .vars
                .iter()
                .find(|(k, _)| k == "TENANCY_TENANT")
                .map_or("?", |(_, v)| v.as_str());
            println!(
                "tenancy: session process {pid} of {user} joined the isolation of job {job} \
                 (tenant {tenant})"
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => refuse(e),
    }
}
