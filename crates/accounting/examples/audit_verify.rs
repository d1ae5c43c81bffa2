//! `tenancyctl audit verify` as a stand-alone binary: same arguments.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: tenancy_accounting::VerifyArgs,
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    tenancy_accounting::run_verify(Cli::parse().args)
}
