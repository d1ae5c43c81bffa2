//! Small driver for benchmarks and manual checks:
//!   scratchtool audit --tenant ta=1001[,1002] [--tenant ...] PATH... [--format ...]
//!   scratchtool wipe --root R --tenant T --tenant-gid G --job N
use clap::{Parser, Subcommand};
use std::process::ExitCode;
use tenancy_scratch::*;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Audit {
        /// NAME=GID[,GID...]
        #[arg(long = "tenant")]
        tenants: Vec<String>,
        #[command(flatten)]
        args: AuditArgs,
    },
    Wipe {
        #[arg(long)]
        root: std::path::PathBuf,
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        tenant_gid: u32,
        #[arg(long)]
        job: u64,
    },
}

fn main() -> anyhow::Result<ExitCode> {
    match Cli::parse().cmd {
        Cmd::Audit { tenants, args } => {
            let mut map = TenantMap::new();
            for t in tenants {
                let (name, gids) = t
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--tenant wants NAME=GID[,GID]"))?;
                let gids: Vec<u32> = gids
                    .split(',')
                    .map(|g| g.parse())
                    .collect::<std::result::Result<_, _>>()?;
                map.insert(name, gids, []);
            }
            run_storage_audit(&args, &map)
        }
        Cmd::Wipe {
            root,
            tenant,
            tenant_gid,
            job,
        } => {
            let spec = ScratchSpec {
                root,
                tenant,
                tenant_gid,
                job_id: job,
                uid: 1,
                gid: 1,
                mode: DEFAULT_JOB_MODE,
                quota: None,
                tenant_groups: Vec::new(),
            };
            println!("{:?}", wipe(&spec)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
