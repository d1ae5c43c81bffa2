//! `tenancyctl adopt`: the PAM side of ssh sessions that pam_slurm_adopt puts into a job (see
//! `tenancy_node::adopt`), for `pam_exec` in the session phase, after pam_slurm_adopt:
//!
//!     account  required  pam_slurm_adopt.so
//!     session  required  pam_exec.so /usr/local/bin/tenancyctl adopt
//!
//! pam_exec runs it as root with PAM_USER and PAM_TYPE set, as a child of the process that
//! becomes the session (its parent, moved by default), and with the PAM environment, where
//! pam_slurm_adopt left SLURM_JOB_ID. Exit 0: joined, or not in a job; exit 1: refused, and with
//! `required` PAM ends the session. pam_exec cannot set the session's environment: the PAM
//! module pam_tenancy.so does the same and also gives the session the job's variables.

use std::process::ExitCode;
use tenancy_config::Config;
use tenancy_node::adopt::{session, Session};

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
    // pam_slurm_adopt puts the job it adopted the session into in the PAM environment, which
    // pam_exec passes on.
    let claimed = std::env::var("SLURM_JOB_ID").ok();
    match session(config, pid, &user, claimed.as_deref(), "tenancyctl") {
        Session::NotInJob => {
            println!(
                "tenancy: session process {pid} of {user} is in no Slurm job: nothing to isolate"
            );
            Ok(ExitCode::SUCCESS)
        }
        Session::Joined { job, tenant, .. } => {
            println!(
                "tenancy: session process {pid} of {user} joined the isolation of job {job} \
                 (tenant {tenant})"
            );
            Ok(ExitCode::SUCCESS)
        }
        Session::Refused { message } => {
            eprintln!("tenancy: {message}");
            Ok(ExitCode::FAILURE)
        }
    }
}
