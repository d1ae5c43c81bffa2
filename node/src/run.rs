//! Entry points of the `tenancy-prolog` and `tenancy-epilog` binaries.
//!
//! Slurm gives them no arguments and no PATH; what they print goes to slurmd's log, and a
//! non-zero exit drains the node (prolog: the job is requeued and held).

use crate::context::JobContext;
use crate::layers;
use crate::spine::{Ending, Spine};
use std::process::ExitCode;
use tenancy_config::Config;

fn finish(end: Ending) -> ExitCode {
    if end.code == 0 {
        println!("{}", end.message);
        ExitCode::SUCCESS
    } else {
        eprintln!("{}", end.message);
        ExitCode::from(end.code.clamp(1, 255) as u8)
    }
}

fn load(origin: &str) -> Result<Config, ExitCode> {
    Config::load(None).map_err(|e| {
        eprintln!("tenancy: {origin}: cannot load the config, failing closed: {e}");
        ExitCode::FAILURE
    })
}

/// Runs the prolog for the job in this process's environment.
pub fn prolog() -> ExitCode {
    let config = match load("tenancy-prolog") {
        Ok(c) => c,
        Err(code) => return code,
    };
    let ctx = JobContext::from_process_env();
    match Spine::new(&config, layers::for_node(&config), "tenancy-prolog") {
        Ok(mut spine) => finish(spine.prolog(ctx)),
        Err(e) => finish(Ending {
            code: 1,
            message: format!("tenancy: tenancy-prolog: {e}; failing closed"),
        }),
    }
}

/// Runs the epilog for the job in this process's environment.
pub fn epilog() -> ExitCode {
    let config = match load("tenancy-epilog") {
        Ok(c) => c,
        Err(code) => return code,
    };
    let ctx = match JobContext::from_process_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tenancy: tenancy-epilog: cannot identify the job: {e}");
            return ExitCode::FAILURE;
        }
    };
    match Spine::new(&config, layers::for_node(&config), "tenancy-epilog") {
        Ok(mut spine) => finish(spine.epilog(&ctx)),
        Err(e) => finish(Ending {
            code: 1,
            message: format!("tenancy: tenancy-epilog: job {}: {e}", ctx.job_id),
        }),
    }
}
