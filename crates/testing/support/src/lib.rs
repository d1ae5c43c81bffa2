//! What slurm-tenancy's tests share across crates (a dev-dependency only, never a dependency of
//! the product):
//!
//! * the skip rule, declared once: a test that needs root, or a tool the machine lacks, says
//!   `SKIP (...)` and returns; under CI (`CI` set) it fails instead, so nothing is skipped
//!   there unseen ([`requires_root`], [`skip`]);
//! * where the build put its artifacts ([`target_dir`], [`built`]) and the NVML stand-in
//!   library ([`nvml_stand_in`]);
//! * tenancy.toml text from a typed builder over the config's keys ([`TenancyToml`]);
//! * fixtures more than one crate's tests use: a seccomp filter that takes `openat2` away
//!   ([`seccomp`]), a file even root cannot remove ([`Immutable`]), real users and groups and a
//!   scratch tree ([`users`]), a file system of a test's own on a loop device ([`loopfs`]), and
//!   seeded audit logs (`audit_logs`, feature `audit-logs`), and the package's systemd units'
//!   commands as tests run them ([`units`]).
//!
//! ```
//! use tenancy_test_support::{requires_root, TenancyToml};
//!
//! fn a_test() {
//!     if !requires_root("a_test") {
//!         return;
//!     }
//!     let root = std::env::temp_dir();
//!     let mut config = TenancyToml::under("t", &root);
//!     config.tier("internal").mig_profiles(["1g.18gb"]);
//!     config.tenant("acme").tier("internal").groups(["root"]);
//!     std::fs::write(root.join("tenancy.toml"), config.to_string()).unwrap();
//! }
//! ```

#[cfg(feature = "audit-logs")]
pub mod audit_logs;
pub mod collector;
mod config;
mod immutable;
#[cfg(feature = "journals")]
pub mod journals;
pub mod loopfs;
pub mod seccomp;
pub mod units;
pub mod users;

pub use config::{GpuPlacement, Limits, ScratchOnExit, TenancyToml};
pub use immutable::Immutable;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Whether this is CI's run (`CI` set): there a test never skips.
pub fn under_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// The skip rule: outside CI, prints `SKIP (why): what` (`SKIP (why)` without `what`) and the
/// caller returns; under CI, panics with the same words.
pub fn skip(why: &str, what: &str) {
    let (seen, fail) = if what.is_empty() {
        (format!("SKIP ({why})"), why.to_string())
    } else {
        (format!("SKIP ({why}): {what}"), format!("{why}: {what}"))
    };
    if under_ci() {
        panic!("{fail}");
    }
    eprintln!("{seen}");
}

/// True as root; otherwise [`skip`]s with `needs root` (a panic under CI).
pub fn requires_root(what: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    skip("needs root", what);
    false
}

/// What a command did, for a failure message: its status, stdout and stderr.
pub fn output_text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// What a command printed: its stdout, then its stderr.
pub fn printed(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `cmd` with `input` on its stdin (and its stdout and stderr captured).
pub fn output_with_stdin(cmd: &mut Command, input: &str) -> std::io::Result<Output> {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input.as_bytes())?;
    child.wait_with_output()
}

/// Makes `cmd` run as the user `uid` with primary group `gid` and the groups `groups` (set in
/// the child between fork and exec: no shell, no su).
pub fn run_as(cmd: &mut Command, uid: u32, gid: u32, groups: Vec<u32>) {
    // SAFETY: only async-signal-safe syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The records of a JSON-lines file (an audit log), in order; none when it is missing, a
/// panic at a line that is not one.
pub fn json_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Vec<T> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

/// `default` inputs for a property campaign, times `TENANCY_FUZZ_SCALE` (a longer campaign:
/// `TENANCY_FUZZ_SCALE=10`; at most 1000).
pub fn fuzz_cases(default: u32) -> u32 {
    let scale = std::env::var("TENANCY_FUZZ_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .clamp(1, 1000);
    default.saturating_mul(scale)
}

/// Where cargo put this build's artifacts (target/<profile>), from the running test, bench
/// or example (target/<profile>/deps/, .../examples/).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the running executable");
    let mut d = exe.parent().expect("its folder").to_path_buf();
    if d.ends_with("deps") || d.ends_with("examples") {
        d.pop();
    }
    d
}

/// What scripts/build-job-path puts in TENANCY_JOB_PATH_DIR: the prolog and epilog as a node
/// installs them.
pub const JOB_PATH: [&str; 3] = ["tenancy-prolog", "tenancy-epilog", "tenancy-prolog-dynamic"];

/// A binary or library of this build by file name (target/<profile>/NAME or its deps/); the
/// job path's binaries from TENANCY_JOB_PATH_DIR when it is set. Err says what to build.
pub fn built(name: &str) -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("TENANCY_JOB_PATH_DIR") {
        if JOB_PATH.contains(&name) {
            let p = Path::new(&dir).join(name);
            return if p.is_file() {
                Ok(p)
            } else {
                Err(format!("TENANCY_JOB_PATH_DIR has no {}", p.display()))
            };
        }
    }
    let t = target_dir();
    [t.join(name), t.join("deps").join(name)]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "{name} not found in {} (build it first: cargo build --workspace, same profile \
                 and CARGO_TARGET_DIR)",
                t.display()
            )
        })
}

/// [`built`], or None after a [`skip`] when it is missing (a panic under CI, and always when
/// TENANCY_JOB_PATH_DIR names it: that folder was asked for).
pub fn built_or_skip(name: &str) -> Option<PathBuf> {
    match built(name) {
        Ok(p) => Some(p),
        Err(e)
            if std::env::var_os("TENANCY_JOB_PATH_DIR").is_some() && JOB_PATH.contains(&name) =>
        {
            panic!("{e}")
        }
        Err(e) => {
            skip(&format!("needs {name}"), &e);
            None
        }
    }
}

/// Writes `root/fixture.toml` for the NVML stand-in: `gpus` H200-141GB, its state, device
/// nodes and driver files under `root` (shim-state.json, dev/, mig-minors, proc-devices: what
/// [`TenancyToml::nvml_stand_in`] points the config at). Returns the fixture's path.
pub fn nvml_fixture(root: &Path, gpus: usize) -> PathBuf {
    let path = root.join("fixture.toml");
    let r = root.display();
    let text = format!(
        "state = \"{r}/shim-state.json\"\ndev_dir = \"{r}/dev\"\nmig_minors = \"{r}/mig-minors\"\n\
         proc_devices = \"{r}/proc-devices\"\n{}",
        "[[gpus]]\nmodel = \"H200-141GB\"\n".repeat(gpus)
    );
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// The NVML stand-in library (`libnvidia_ml.so` of `cargo build -p nvml-shim`, same target
/// folder; TENANCY_NVML_SHIM names another), or None after a [`skip`].
pub fn nvml_stand_in() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TENANCY_NVML_SHIM") {
        return Some(PathBuf::from(p));
    }
    let p = target_dir().join("libnvidia_ml.so");
    if p.exists() {
        return Some(p);
    }
    skip(
        "needs nvml-shim",
        &format!(
            "{} missing; run `cargo build -p nvml-shim` with the same CARGO_TARGET_DIR",
            p.display()
        ),
    );
    None
}
