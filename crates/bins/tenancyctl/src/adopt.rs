//! `tenancyctl adopt`: the PAM side of ssh sessions that pam_slurm_adopt puts into a job (see
//! `tenancy_job::adopt`, re-exported as `tenancy_job::adopt`), for `pam_exec` in the session
//! phase, after pam_slurm_adopt:
//!
//!     account  required  pam_slurm_adopt.so
//!     session  required  pam_exec.so /usr/local/bin/tenancyctl --config /etc/slurm/tenancy.toml adopt
//!
//! pam_exec runs it as root with PAM_USER and PAM_TYPE set, as a child of the process that
//! becomes the session (its parent, moved by default), and with the PAM environment, where
//! pam_slurm_adopt left SLURM_JOB_ID. Exit 0: joined, or not in a job; exit 1: refused, and with
//! `required` PAM ends the session. pam_exec cannot set the session's environment: the PAM
//! module pam_tenancy.so does the same and also gives the session the job's variables.
//!
//! The environment pam_exec gives is the PAM environment first, which the user can write to
//! (`pam_env.so user_readenv=1` reads `~/.pam_environment`, as Debian's sshd service does),
//! then pam_exec's own PAM_USER, PAM_TYPE, ... appended after it: a name can be there twice,
//! and `getenv` returns the first, the user's. So PAM_TYPE and PAM_USER are taken from their
//! last occurrence ([`pam_exec_var`]), and under pam_exec a config found through the
//! environment (TENANCY_CONFIG, SLURM_CONF) is used only when root owns it and nobody else can
//! write it (main.rs), or a user could name a config of their own, with its journals and audit
//! log where they like.

use std::process::ExitCode;
use tenancy_config::Config;
use tenancy_job::adopt::{session, Session};

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
    if pam_exec_var(std::env::vars_os(), "PAM_TYPE").is_some_and(|t| t != "open_session") {
        return Ok(ExitCode::SUCCESS);
    }
    let Some(user) = args
        .user
        .clone()
        .or_else(|| pam_exec_var(std::env::vars_os(), "PAM_USER"))
    else {
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

/// Whether pam_exec runs this process: it always sets PAM_TYPE, after the PAM environment.
pub fn under_pam_exec() -> bool {
    pam_exec_var(std::env::vars_os(), "PAM_TYPE").is_some()
}

/// The value pam_exec gave `name`: its last occurrence in `env` (the process's environment in
/// its order), as pam_exec appends its own variables after the PAM environment, where a user
/// may have put the same name first. None when absent or not UTF-8.
fn pam_exec_var(
    env: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    name: &str,
) -> Option<String> {
    env.filter(|(k, _)| k == name)
        .last()
        .and_then(|(_, v)| v.into_string().ok())
}

#[cfg(test)]
mod tests {
    use super::pam_exec_var;
    use std::ffi::OsString;

    fn env(pairs: &[(&str, &str)]) -> impl Iterator<Item = (OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn pam_exec_s_own_value_wins_over_one_the_user_put_first() {
        let e = [
            ("PAM_TYPE", "close_session"),
            ("PAM_USER", "root"),
            ("LANG", "C"),
            ("PAM_USER", "u1234"),
            ("PAM_TYPE", "open_session"),
        ];
        assert_eq!(
            pam_exec_var(env(&e), "PAM_TYPE").as_deref(),
            Some("open_session")
        );
        assert_eq!(pam_exec_var(env(&e), "PAM_USER").as_deref(), Some("u1234"));
        assert_eq!(pam_exec_var(env(&e), "PAM_RHOST"), None);
    }
}
