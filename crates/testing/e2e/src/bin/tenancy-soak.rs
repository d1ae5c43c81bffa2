//! The soak at size (scripts/soak): thousands of jobs of three tenants on the two-node cluster
//! while Slurm's daemons, prologs, epilogs and nodes fail at random times, then the checks of
//! src/soak/checks.rs. Prints the summary (BENCHMARKS.md keeps it); exit 1 when a check
//! failed, 2 when the soak could not run. Needs root.

use clap::Parser;
use std::process::ExitCode;
use std::time::Duration;
use tenancy_e2e::soak::{self, Plan};
use tenancy_e2e::{Options, Users};

#[derive(Parser)]
#[command(about = "Soak the two-node cluster with jobs and faults, then check what is left")]
struct Args {
    /// Batch submissions (an array counts once).
    #[arg(long, default_value_t = 5000)]
    jobs: usize,
    /// The random seed: the same seed gives the same jobs and faults in the same order.
    #[arg(long, default_value_t = 46)]
    seed: u64,
    /// Stop submitting after this many minutes, whatever is left.
    #[arg(long, default_value_t = 240)]
    minutes: u64,
    /// Seconds between faults on average; 0: no faults.
    #[arg(long, default_value_t = 20)]
    fault_every: u64,
    /// Jobs pending or running at most.
    #[arg(long, default_value_t = 24)]
    queue: usize,
    /// Longest job, in seconds.
    #[arg(long, default_value_t = 3)]
    max_secs: u32,
    /// Seconds between runs of tenancy-reconcile.timer's command on every node; 0: none.
    #[arg(long, default_value_t = 30)]
    sweep_every: u64,
    /// Also write the summary to this file.
    #[arg(long)]
    summary: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("tenancy-soak: needs root (it starts Slurm's daemons and makes users)");
        return ExitCode::from(2);
    }
    let plan = Plan {
        jobs: a.jobs,
        seed: a.seed,
        limit: Duration::from_secs(a.minutes * 60),
        fault_every: (a.fault_every > 0).then(|| Duration::from_secs(a.fault_every)),
        queue: a.queue,
        max_secs: a.max_secs,
        sweep_every: (a.sweep_every > 0).then(|| Duration::from_secs(a.sweep_every)),
    };
    let mut users = Users::new();
    let result = soak::cluster(&mut users, Options::default())
        .and_then(|(mut mn, submitters)| soak::run(&mut mn, &plan, &submitters));
    let summary = match result {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tenancy-soak: {e:#}");
            return ExitCode::from(2);
        }
    };
    println!("{summary}");
    if let Some(p) = &a.summary {
        if let Err(e) = std::fs::write(p, summary.to_string()) {
            eprintln!("tenancy-soak: write {}: {e}", p.display());
        }
    }
    if summary.checks.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
