//! `tenancyctl report` as a stand-alone binary (for benchmarks): same arguments.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: tenancy_accounting::ReportArgs,
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    tenancy_accounting::run_report(Cli::parse().args)
}
