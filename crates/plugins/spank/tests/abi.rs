//! The plugin is built for the Slurm installed here: Slurm's loader refuses a SPANK plugin
//! whose plugin_version differs in major.minor from its own.

use std::path::Path;

fn installed_version() -> Option<u32> {
    let text = std::fs::read_to_string("/usr/include/slurm/slurm_version.h").ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with("#define SLURM_VERSION_NUMBER"))?;
    let hex = line.split_whitespace().nth(2)?.trim_start_matches("0x");
    u32::from_str_radix(hex, 16).ok()
}

#[test]
fn plugin_version_matches_installed_slurm() {
    let Some(v) = installed_version() else {
        eprintln!("SKIP: no /usr/include/slurm/slurm_version.h (libslurm-dev)");
        return;
    };
    assert_eq!(
        spank_tenancy::SLURM_VERSION_NUMBER & 0xffff00,
        v & 0xffff00,
        "plugin built for {:#x}, installed Slurm is {v:#x}",
        spank_tenancy::SLURM_VERSION_NUMBER
    );
}

#[test]
fn cdylib_exports_what_slurm_loads() {
    // target/<profile>/deps/abi-xxx -> target/<profile>/libspank_tenancy.so
    let exe = std::env::current_exe().unwrap();
    let so = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("libspank_tenancy.so");
    if !so.is_file() {
        eprintln!("SKIP: {} not built", so.display());
        return;
    }
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(Path::new(&so))
        .output();
    let Ok(out) = out else {
        eprintln!("SKIP: nm not available");
        return;
    };
    let syms = String::from_utf8_lossy(&out.stdout);
    for s in [
        "plugin_name",
        "plugin_type",
        "plugin_version",
        "slurm_spank_init",
        "slurm_spank_init_post_opt",
        "slurm_spank_task_init_privileged",
    ] {
        assert!(
            syms.lines().any(|l| l.split_whitespace().last() == Some(s)),
            "{s} not exported by {}",
            so.display()
        );
    }
}
