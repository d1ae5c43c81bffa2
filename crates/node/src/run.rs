//! Entry points of the `tenancy-prolog` and `tenancy-epilog` binaries.
//!
//! Slurm gives them no arguments and no PATH; what they print goes to slurmd's log, and a
//! non-zero exit drains the node (prolog: the job is requeued and held).

use crate::layers;
use crate::spine::{Ending, Handoff, Spine};
use std::process::ExitCode;
use tenancy_config::Config;
use tenancy_job::context::JobContext;

/// Drains this node with `message` as the reason before a failing prolog exits, so that
/// `sinfo -R` names the product, the job and the cause instead of Slurm's bare "Prolog error"
/// (slurmctld keeps a reason already set when it drains the node for the failed prolog).
/// Best effort: the non-zero exit drains the node anyway.
fn drain_with_reason(message: &str) {
    let Some(node) = std::env::var_os("SLURMD_NODENAME").filter(|n| !n.is_empty()) else {
        return;
    };
    let node = node.to_string_lossy();
    // One line; scontrol takes it as one argument (no shell), Slurm shows it verbatim.
    let mut reason: String = message.split_whitespace().collect::<Vec<_>>().join(" ");
    if reason.len() > 400 {
        let mut cut = 400;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
    }
    // slurmd gives the prolog no PATH but does give SLURM_CONF, which scontrol reads.
    let child = std::process::Command::new("/usr/bin/scontrol")
        .arg("update")
        .arg(format!("nodename={node}"))
        .arg("state=drain")
        .arg(format!("reason={reason}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tenancy: cannot run /usr/bin/scontrol to set the drain reason: {e}");
            return;
        }
    };
    // Never let a hung slurmctld hold the prolog past Slurm's own timeouts.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return,
            Ok(Some(st)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                eprintln!(
                    "tenancy: scontrol could not set the drain reason ({st}): {}",
                    err.trim()
                );
                return;
            }
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                eprintln!("tenancy: scontrol did not set the drain reason within 10 s");
                return;
            }
        }
    }
}

fn finish(end: Ending) -> u8 {
    if end.code == 0 {
        println!("{}", end.message);
        0
    } else {
        eprintln!("{}", end.message);
        end.code.clamp(1, 255) as u8
    }
}

fn load(origin: &str) -> Result<Config, Ending> {
    tenancy_job::config_cache::load(None).map_err(|e| Ending {
        code: 1,
        message: format!("tenancy: {origin}: cannot load the config, failing closed: {e}"),
    })
}

/// Slurm drains the node when the prolog or epilog fails; say why, then exit.
fn finish_or_drain(end: Ending) -> u8 {
    if end.code != 0 {
        drain_with_reason(&end.message);
    }
    finish(end)
}

/// The body of a binary's C `main`: runs `body`, flushes stdout and returns the exit status;
/// a panic is caught and fails the run (status 101, as under Rust's own `main`).
///
/// The prolog and epilog start for every job, so they define C's `main` themselves
/// (`#![no_main]`) and skip Rust's start-up wrapper, which reads /proc/self/maps for the main
/// thread's stack guard and sets up signal handlers: about 0.1 ms of each run (BENCHMARKS.md).
/// std works as usual but for its arguments: glibc hands std argv, musl does not (the job path's
/// musl build, scripts/build-job-path), so a `main` that reads arguments takes them from C.
pub fn c_main(body: fn() -> u8) -> std::os::raw::c_int {
    let status = std::panic::catch_unwind(body).unwrap_or(101);
    let _ = std::io::Write::flush(&mut std::io::stdout());
    status.into()
}

/// The body of the C `main` of `tenancy-prolog` and of [`DYNAMIC_BUILD`]: the prolog, or with
/// [`HANDED_OFF_EPILOG`] as the one argument, the epilog. `argc` and `argv` are C's `main`'s.
///
/// # Safety
/// `argv` holds `argc` pointers to NUL-terminated strings, as C's `main` receives them.
pub unsafe fn prolog_main(
    argc: std::os::raw::c_int,
    argv: *const *const std::os::raw::c_char,
) -> std::os::raw::c_int {
    // SAFETY: argv[1] exists when argc is 2 (the caller's contract).
    let handed_off = argc == 2
        && unsafe { std::ffi::CStr::from_ptr(*argv.add(1)) }.to_bytes()
            == HANDED_OFF_EPILOG.as_bytes();
    c_main(if handed_off {
        handed_off_epilog_status
    } else {
        prolog_status
    })
}

/// Runs the prolog for the job in this process's environment.
pub fn prolog() -> ExitCode {
    ExitCode::from(prolog_status())
}

/// Runs the epilog for the job in this process's environment.
pub fn epilog() -> ExitCode {
    ExitCode::from(epilog_status())
}

/// The dynamically linked build of the prolog and epilog, installed beside the static
/// `tenancy-prolog` and `tenancy-epilog`: they hand it the jobs that need a shared library
/// (NVML for a MIG slice, NSS modules for users and groups; `crate::linkage`). Without
/// arguments it runs the prolog, with [`HANDED_OFF_EPILOG`] the epilog.
pub const DYNAMIC_BUILD: &str = "tenancy-prolog-dynamic";

/// Whether the job asked for a MIG slice (`--mig`, SPANK_TENANCY_MIG): NVML's work.
fn asked_for_mig() -> bool {
    std::env::var_os("SPANK_TENANCY_MIG").is_some_and(|v| !v.is_empty())
}

/// Set in the environment of the detached process an epilog starts to delete the erased job
/// folders it moved into the trash of the scratch root named here ([`empty_trash`]).
pub const EMPTY_TRASH: &str = "TENANCY_EMPTY_TRASH";

/// Starts this same program (its arguments, its environment) detached from the prolog or
/// epilog, in a process group of its own (Slurm ends the group of its script) with no
/// standard streams (slurmd waits for the script's output to close), to delete what this
/// process moved into the trash of `scratch_root`; it deletes at low priority and leaves at
/// once if another one is at it. A failure to start is reported: the trash waits for the next
/// epilog or `tenancyctl reconcile`.
fn spawn_trash_emptier(scratch_root: &std::path::Path) -> Option<String> {
    use std::os::unix::process::CommandExt;
    let spawned = std::process::Command::new("/proc/self/exe")
        .args(std::env::args_os().skip(1))
        .env(EMPTY_TRASH, scratch_root)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    match spawned {
        Ok(_) => None,
        Err(e) => Some(format!(
            "the erased scratch folders wait in {}/{} (starting their deletion failed: {e}; `tenancyctl reconcile --apply` deletes them)",
            scratch_root.display(),
            tenancy_scratch::trash::TRASH_DIR
        )),
    }
}

/// The detached deleter's body ([`EMPTY_TRASH`] set): empties that trash, at the lowest CPU
/// and I/O priority, and exits 0 (nothing of it is Slurm's business any more).
fn empty_trash() -> Option<u8> {
    let root = std::env::var_os(EMPTY_TRASH)?;
    let _ = rustix::process::setpriority_process(None, 19);
    // ioprio_set(IOPRIO_WHO_PROCESS, self, IOPRIO_CLASS_IDLE): rustix has no wrapper.
    // SAFETY: a plain system call with integer arguments.
    unsafe {
        libc::syscall(libc::SYS_ioprio_set, 1, 0, 3 << 13);
    }
    let _ = tenancy_scratch::trash::empty(std::path::Path::new(&root), false);
    Some(0)
}

/// Ends a prolog or epilog run: a folder moved into the trash gets its deleter started first.
fn finish_run(config: &Config, mut end: Ending) -> u8 {
    if tenancy_scratch::trash::pending() {
        if let Some(note) = spawn_trash_emptier(&config.cluster.scratch_root) {
            end.message.push_str("; ");
            end.message.push_str(&note);
        }
    }
    finish_or_drain(end)
}

/// [`prolog`], as an exit status: the body of `tenancy-prolog` and of [`DYNAMIC_BUILD`].
///
/// `tenancy-prolog` is statically linked (build-support/link.rs). A job it cannot run alone
/// (a MIG slice, or identities beyond /etc/passwd and /etc/group:
/// `linkage::identity_from_files`) goes to the dynamic build, with the same environment. The
/// cases known from the environment and nsswitch.conf go at once, before the config is read;
/// the spine meets the rest (a tier's profile, an earlier attempt's slice, a denial that other
/// NSS sources might overturn) and reports a failed hand-off.
pub fn prolog_status() -> u8 {
    if let Some(status) = empty_trash() {
        return status;
    }
    let handoff = (!crate::linkage::can_load_libraries()).then(|| Handoff {
        sibling: DYNAMIC_BUILD.to_string(),
        args: Vec::new(),
        env: Vec::new(),
    });
    if let Some(h) = &handoff {
        if asked_for_mig() || crate::linkage::identity_from_files().is_err() {
            // Returns only when the exec failed; the spine then fails closed and says so.
            let _ = h.exec();
        }
    }
    let config = match load("tenancy-prolog") {
        Ok(c) => c,
        Err(end) => return finish_or_drain(end),
    };
    let ctx = JobContext::from_process_env();
    let end = match Spine::new(&config, layers::for_node(&config), "tenancy-prolog") {
        Ok(mut spine) => {
            spine.handoff = handoff;
            spine.prolog(ctx)
        }
        Err(e) => Ending {
            code: 1,
            message: format!("tenancy: tenancy-prolog: {e}; failing closed"),
        },
    };
    finish_run(&config, end)
}

/// [`epilog`], as an exit status: the body of `tenancy-epilog`. That binary is statically
/// linked (build-support/link.rs), so a job with a layer that needs a shared library (NVML for
/// a MIG slice) is handed to the dynamically linked [`DYNAMIC_BUILD`] next to it, run as
/// `tenancy-prolog-dynamic --epilog` ([`handed_off_epilog_status`]).
pub fn epilog_status() -> u8 {
    if let Some(status) = empty_trash() {
        return status;
    }
    if crate::linkage::can_load_libraries() {
        return epilog_with(None);
    }
    // The job id travels as HANDOFF_JOB_ID, not SLURM_JOB_ID: a program that does not know
    // `--epilog` then fails for want of a job (and the node drains) instead of running the
    // prolog again for a job that has ended.
    let handoff = Handoff {
        sibling: DYNAMIC_BUILD.to_string(),
        args: vec![HANDED_OFF_EPILOG.to_string()],
        env: vec![
            ("SLURM_JOB_ID".to_string(), None),
            (
                HANDOFF_JOB_ID.to_string(),
                std::env::var("SLURM_JOB_ID").ok(),
            ),
        ],
    };
    // A job that asked for a MIG slice is handed off before the config and journal are read
    // here, which the other process reads again. The journal has the last word: a slice this
    // check misses is handed off once the journal is read, and a failed exec here is met and
    // reported there.
    if asked_for_mig() {
        let _ = handoff.exec();
    }
    epilog_with(Some(handoff))
}

/// The argument that makes [`DYNAMIC_BUILD`] (and `tenancy-prolog`) run the epilog: a
/// statically linked epilog's hand-off (Slurm itself passes no arguments).
pub const HANDED_OFF_EPILOG: &str = "--epilog";

/// Where a handed-off job's id travels (see [`epilog_status`]).
pub const HANDOFF_JOB_ID: &str = "TENANCY_HANDOFF_JOB_ID";

/// The epilog as `tenancy-prolog-dynamic --epilog` runs it: the same teardown and records
/// (origin `tenancy-epilog`), every layer in this process (or, in a statically linked
/// `tenancy-prolog --epilog`, handed on as `tenancy-epilog` would).
pub fn handed_off_epilog_status() -> u8 {
    if let Some(status) = empty_trash() {
        return status;
    }
    // Single-threaded here: nothing else reads the environment yet.
    if let Some(id) = std::env::var_os(HANDOFF_JOB_ID) {
        std::env::set_var("SLURM_JOB_ID", id);
        std::env::remove_var(HANDOFF_JOB_ID);
    }
    if crate::linkage::can_load_libraries() {
        epilog_with(None)
    } else {
        epilog_status()
    }
}

fn epilog_with(handoff: Option<Handoff>) -> u8 {
    let config = match load("tenancy-epilog") {
        Ok(c) => c,
        Err(end) => return finish_or_drain(end),
    };
    let ctx = match JobContext::from_process_env() {
        Ok(c) => c,
        Err(e) => {
            return finish_or_drain(Ending {
                code: 1,
                message: format!("tenancy: tenancy-epilog: cannot identify the job: {e}"),
            })
        }
    };
    let end = match Spine::new(&config, layers::for_node(&config), "tenancy-epilog") {
        Ok(mut spine) => {
            spine.handoff = handoff;
            spine.epilog(&ctx)
        }
        Err(e) => Ending {
            code: 1,
            message: format!("tenancy: tenancy-epilog: job {}: {e}", ctx.job_id),
        },
    };
    finish_run(&config, end)
}
