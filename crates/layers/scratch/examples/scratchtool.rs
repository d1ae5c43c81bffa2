//! Small driver for benchmarks and manual checks:
//!   scratchtool audit --tenant ta=1001[,1002] [--tenant ...] PATH... [--format ...]
//!   scratchtool wipe --root R --tenant T --tenant-gid G --job N
//!   scratchtool create --root R --tenant T --tenant-gid G --job N --uid U [--encrypt]
//!   scratchtool erase --root R --tenant T --tenant-gid G --job N --key ID
//!   scratchtool empty-trash --root R
//!   scratchtool bench-create --root R --tenant T --tenant-gid G --uid U --jobs N [--encrypt]
//! (create, erase, wipe and empty-trash print the microseconds they took on stderr.)
use clap::{Parser, Subcommand};
use std::process::ExitCode;
use tenancy_scratch::*;
use tenancy_storage_audit::{run_storage_audit, AuditArgs, TenantMap};

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
        #[command(flatten)]
        job: JobArgs,
    },
    /// The prolog's scratch step (with --encrypt: a fresh key, the policy, the key added).
    Create {
        #[command(flatten)]
        job: JobArgs,
        #[arg(long, default_value_t = 1000)]
        uid: u32,
        #[arg(long)]
        encrypt: bool,
    },
    /// The epilog's step for an encrypted wipe tier: key removed, folder moved to the trash.
    Erase {
        #[command(flatten)]
        job: JobArgs,
        #[arg(long)]
        key: KeyId,
    },
    /// What the epilog's detached deleter does.
    EmptyTrash {
        #[arg(long)]
        root: std::path::PathBuf,
    },
    /// `--jobs` creates and wipes (or creates and erases, trash emptied after each), each
    /// create's time printed in microseconds, one a line.
    BenchCreate {
        #[arg(long)]
        root: std::path::PathBuf,
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        tenant_gid: u32,
        #[arg(long, default_value_t = 1000)]
        uid: u32,
        #[arg(long, default_value_t = 200)]
        jobs: u64,
        #[arg(long)]
        encrypt: bool,
    },
}

#[derive(clap::Args)]
struct JobArgs {
    #[arg(long)]
    root: std::path::PathBuf,
    #[arg(long)]
    tenant: String,
    #[arg(long)]
    tenant_gid: u32,
    #[arg(long)]
    job: u64,
}

fn spec_of(j: &JobArgs, uid: u32) -> ScratchSpec {
    ScratchSpec {
        root: j.root.clone(),
        tenant: j.tenant.clone(),
        tenant_gid: j.tenant_gid,
        job_id: j.job,
        uid,
        gid: j.tenant_gid,
        mode: DEFAULT_JOB_MODE,
        quota: None,
        tenant_groups: Vec::new(),
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> T {
    let t = std::time::Instant::now();
    let r = f();
    eprintln!("{}", t.elapsed().as_micros());
    r
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
        Cmd::Wipe { job } => {
            let spec = spec_of(&job, 1);
            println!("{:?}", timed(|| wipe(&spec))?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Create { job, uid, encrypt } => {
            let spec = spec_of(&job, uid);
            let made = timed(|| {
                if encrypt {
                    let key = JobKey::generate()?;
                    create_encrypted(&spec, &key, None).map_err(anyhow::Error::from)
                } else {
                    create(&spec).map_err(anyhow::Error::from)
                }
            })?;
            println!("{}", serde_json::to_string(&made)?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Erase { job, key } => {
            let spec = spec_of(&job, 1);
            println!("{:?}", timed(|| erase(&spec, key))?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::EmptyTrash { root } => {
            let done = timed(|| trash::empty(&root, true))?;
            println!(
                "removed {} failed {}",
                done.removed.len(),
                done.failed.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::BenchCreate {
            root,
            tenant,
            tenant_gid,
            uid,
            jobs,
            encrypt,
        } => {
            for job in 0..jobs {
                let j = JobArgs {
                    root: root.clone(),
                    tenant: tenant.clone(),
                    tenant_gid,
                    job: 9_000_000 + job,
                };
                let spec = spec_of(&j, uid);
                let t = std::time::Instant::now();
                let key = if encrypt {
                    let key = JobKey::generate()?;
                    create_encrypted(&spec, &key, None)?;
                    Some(key.id())
                } else {
                    create(&spec)?;
                    None
                };
                println!("{}", t.elapsed().as_micros());
                match key {
                    Some(id) => {
                        erase(&spec, id)?;
                        trash::empty(&root, true)?;
                    }
                    None => {
                        wipe(&spec)?;
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
