//! `tenancyctl doctor`: is this node set up so that every layer can isolate every job?
//! Checks the product's own prerequisites, then the device layer's view of cgroups and Slurm.
//! One module per check group; [`run`] runs them in order and prints their rows.

use crate::output::Format;
use crate::output::Rows;
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use tenancy_config::Config;
use tenancy_devices::doctor::Severity;

mod devices;
mod firewall;
mod kernel;
mod nvml;
mod pam;
mod slurm;
mod state;

use devices::device_rows;
use firewall::firewall_rows;
use kernel::kernel_rows;
use nvml::nvml_rows;
use pam::pam_rows;
use slurm::slurm_rows;
use state::state_rows;

#[derive(clap::Args)]
pub struct DoctorArgs {
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Slurm's cgroup.conf (default: next to SLURM_CONF, else /etc/slurm/cgroup.conf)
    #[arg(long)]
    pub slurm_cgroup_conf: Option<PathBuf>,
    /// PAM configuration folder searched for pam_slurm_adopt
    #[arg(long, default_value = "/etc/pam.d")]
    pub pam_dir: PathBuf,
    /// Slurm's slurm.conf, read for its Prolog= and Epilog= lines (default: SLURM_CONF, else
    /// /etc/slurm/slurm.conf)
    #[arg(long)]
    pub slurm_conf: Option<PathBuf>,
}

#[derive(Serialize)]
struct Row {
    check: String,
    severity: String,
    message: String,
    remedy: String,
}

fn row(check: &str, severity: Severity, message: String, remedy: Option<String>) -> Row {
    Row {
        check: check.into(),
        severity: format!("{severity:?}").to_lowercase(),
        message,
        remedy: remedy.unwrap_or_default(),
    }
}

pub fn run(config: &Config, args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let mut rows = Vec::new();
    state_rows(config, &mut rows);
    nvml_rows(config, &mut rows);
    firewall_rows(config, &mut rows);
    let ssh_contained = pam_rows(args, &mut rows);
    slurm_rows(config, args, ssh_contained, &mut rows);
    kernel_rows(&mut rows);
    device_rows(config, args, &mut rows);
    let failed = rows.iter().any(|r| r.severity == "error");
    Rows {
        headers: &["check", "severity", "message", "remedy"],
        rows: &rows,
        cells: |r| {
            vec![
                r.check.clone(),
                r.severity.clone(),
                r.message.clone(),
                r.remedy.clone(),
            ]
        },
    }
    .print(args.format)?;
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
