//! The real prolog, with a boundary hook that can kill the process: the crash tests' driver.
//!
//! ```text
//! crash_prolog prolog [--crash-at N]   # SIGKILL itself at boundary number N (1-based)
//! crash_prolog epilog                  # exactly what `tenancy-epilog` runs
//! crash_prolog firewall-apply          # what `tenancyctl firewall apply` does, for this config
//! crash_prolog driver-load             # starts NVML once, as loading the driver at boot would
//! ```
//!
//! The config comes from `TENANCY_CONFIG`, the job from the Slurm variables, as for the
//! binaries. Every boundary reached is printed to stdout (`boundary <n> <what>`) and flushed
//! before the process kills itself, so a test knows where it died and how many boundaries a
//! full prolog has (run it without `--crash-at`).

use std::io::Write;
use std::process::ExitCode;
use tenancy_config::Config;
use tenancy_job::JobContext;
use tenancy_node::{layers, run, Boundary, Spine};

fn usage() -> ExitCode {
    eprintln!("usage: crash_prolog prolog [--crash-at N] | epilog | firewall-apply | driver-load");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["epilog"] => run::epilog(),
        ["firewall-apply"] => firewall_apply(),
        ["driver-load"] => driver_load(),
        ["prolog"] => prolog(None),
        ["prolog", "--crash-at", n] => match n.parse::<u32>() {
            Ok(n) if n > 0 => prolog(Some(n)),
            _ => usage(),
        },
        _ => usage(),
    }
}

/// The NVML stand-in lays out device nodes, /proc/devices and mig-minors when NVML starts.
fn driver_load() -> ExitCode {
    let loaded = Config::load(None).map_err(|e| e.to_string()).and_then(|c| {
        if let Some(f) = &c.cluster.nvml_shim_fixture {
            std::env::set_var("NVML_SHIM_FIXTURE", f);
        }
        let mig =
            tenancy_mig::Mig::open(c.cluster.nvml_library.as_deref()).map_err(|e| e.to_string())?;
        mig.gpus().map(|_| ()).map_err(|e| e.to_string())
    });
    match loaded {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crash_prolog: driver-load: {e}");
            ExitCode::FAILURE
        }
    }
}

fn firewall_apply() -> ExitCode {
    let applied = Config::load(None)
        .map_err(|e| e.to_string())
        .and_then(|c| layers::network::firewall_spec(&c).map_err(|e| e.0))
        .and_then(|spec| tenancy_network::apply(&spec).map_err(|e| e.to_string()));
    match applied {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crash_prolog: firewall apply: {e}");
            ExitCode::FAILURE
        }
    }
}

fn prolog(crash_at: Option<u32>) -> ExitCode {
    let config = match Config::load(None) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crash_prolog: cannot load the config: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut spine = match Spine::new(&config, layers::for_node(&config), "tenancy-prolog") {
        Ok(s) => s,
        Err(e) => {
            eprintln!("crash_prolog: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut n = 0u32;
    spine.boundary_hook = Some(Box::new(move |b: Boundary| {
        // Nothing is journaled or made at Checked: a crash there is a crash before the prolog
        // began, and the boundaries' numbers stay those the crash tests know.
        if b == Boundary::Checked {
            return;
        }
        n += 1;
        let what = match b {
            Boundary::Checked => unreachable!(),
            Boundary::Intended(l) => format!("intended {l}"),
            Boundary::Made(l) => format!("made {l}"),
            Boundary::IntentsOnDisk => "intents-on-disk".to_string(),
            Boundary::AllMade => "all-made".to_string(),
        };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "boundary {n} {what}");
        let _ = out.flush();
        if crash_at == Some(n) {
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
            // SIGKILL cannot be caught; never return into the spine.
            loop {
                std::thread::park();
            }
        }
    }));
    let end = spine.prolog(JobContext::from_process_env());
    if end.code == 0 {
        println!("{}", end.message);
        ExitCode::SUCCESS
    } else {
        eprintln!("{}", end.message);
        ExitCode::from(end.code.clamp(1, 255) as u8)
    }
}
