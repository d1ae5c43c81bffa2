//! `tenancyctl devices ...` subcommands (main.rs dispatches to [`run`]).

use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tenancy_cgroup::layout::MOUNTINFO;
use tenancy_devices::cli::render;
use tenancy_devices::doctor::{doctor, DoctorParams, Severity};
use tenancy_devices::driver::{DriverPaths, MIG_MINORS, PROC_DEVICES};

use crate::output::Format;

/// Devices layer commands.
#[derive(Debug, Args)]
pub struct DevicesArgs {
    #[command(subcommand)]
    pub cmd: DevicesCmd,
}

#[derive(Debug, Subcommand)]
pub enum DevicesCmd {
    /// Check that this node's cgroup/Slurm/driver setup lets the device allowlist bind every task.
    Doctor(DoctorArgs),
    /// Show the device programs attached to a cgroup2 directory.
    Query(QueryArgs),
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[arg(long, default_value = MOUNTINFO)]
    pub mountinfo: PathBuf,
    #[arg(long, default_value = "/etc/slurm/cgroup.conf")]
    pub slurm_cgroup_conf: PathBuf,
    #[arg(long, default_value = PROC_DEVICES)]
    pub proc_devices: PathBuf,
    #[arg(long, default_value = MIG_MINORS)]
    pub mig_minors: PathBuf,
    /// Do not try to load a BPF program.
    #[arg(long)]
    pub no_bpf_probe: bool,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// cgroup2 directory
    pub cgroup: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// The devices crate's rendering of a `--format`.
fn render_format(f: Format) -> tenancy_devices::cli::Format {
    match f {
        Format::Table => tenancy_devices::cli::Format::Table,
        Format::Csv => tenancy_devices::cli::Format::Csv,
        Format::Json => tenancy_devices::cli::Format::Json,
    }
}

/// Run a devices subcommand. Doctor exits 1 when any finding is an error.
pub fn run(args: DevicesArgs) -> anyhow::Result<ExitCode> {
    match args.cmd {
        DevicesCmd::Doctor(a) => {
            let findings = doctor(&DoctorParams {
                mountinfo: a.mountinfo,
                slurm_cgroup_conf: a.slurm_cgroup_conf,
                driver: DriverPaths {
                    proc_devices: a.proc_devices,
                    mig_minors: a.mig_minors,
                    ..DriverPaths::default()
                },
                probe_bpf: !a.no_bpf_probe,
            });
            print!("{}", render(&findings, render_format(a.format))?);
            let bad = findings.iter().any(|f| f.severity == Severity::Error);
            Ok(if bad {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        DevicesCmd::Query(a) => {
            let (ids, flags) = tenancy_devices::v2::query(&a.cgroup)?;
            let mut out = String::new();
            match a.format {
                Format::Json => {
                    out = serde_json::to_string_pretty(&serde_json::json!({
                        "cgroup": a.cgroup, "attach_flags": flags, "prog_ids": ids }))?;
                    out.push('\n');
                }
                Format::Csv => {
                    out += "prog_id,attach_flags\n";
                    for id in &ids {
                        out += &format!("{id},{flags}\n");
                    }
                }
                Format::Table => {
                    out += "PROG_ID  ATTACH_FLAGS\n";
                    for id in &ids {
                        out += &format!("{id:<7}  {flags}\n");
                    }
                }
            }
            print!("{out}");
            Ok(ExitCode::SUCCESS)
        }
    }
}
