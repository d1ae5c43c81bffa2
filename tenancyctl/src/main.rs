//! `tenancyctl`: the admin's view of slurm-tenancy.

mod check;
mod output;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tenancy_audit::Format;
use tenancy_config::Config;

#[derive(Parser)]
#[command(
    name = "tenancyctl",
    version,
    about = "Administer slurm-tenancy: config, node, audit"
)]
struct Cli {
    /// Config file (default: TENANCY_CONFIG, tenancy.toml next to SLURM_CONF, /etc/slurm/tenancy.toml)
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the config and summarise what each tenant and tier enforces (exit 0 or 1)
    Check {
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Accounting report over one or many audit logs
    Report(tenancy_audit::ReportArgs),
    /// Audit log integrity
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Check every node's hash chain; report the first bad record with its line
    Verify(tenancy_audit::VerifyArgs),
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check { format } => match Config::load(cli.config.as_deref()) {
            Ok(config) => check::run(&config, format),
            Err(e) => {
                eprintln!("{e}");
                Ok(ExitCode::FAILURE)
            }
        },
        Command::Report(args) => tenancy_audit::run_report(args),
        Command::Audit {
            command: AuditCommand::Verify(args),
        } => tenancy_audit::run_verify(args),
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tenancyctl: {e:#}");
            ExitCode::from(2)
        }
    }
}
