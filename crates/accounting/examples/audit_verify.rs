//! `tenancyctl audit verify` as a stand-alone binary: same arguments.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: tenancy_audit::VerifyArgs,
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    tenancy_audit::run_verify(Cli::parse().args)
}
