//! How the job-path binaries are linked: they start once per job (BENCHMARKS.md,
//! build-support/link.rs).

use std::process::Command;
use tenancy_e2e::artifact;

/// `readelf -W <flag>` of `name`'s binary, or None (skip) when it or readelf is missing.
fn readelf(name: &str, flag: &str) -> Option<String> {
    let bin = match artifact(name) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("SKIP {name}: {e}");
            return None;
        }
    };
    match Command::new("readelf")
        .arg(flag)
        .arg("-W")
        .arg(&bin)
        .output()
    {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        other => {
            eprintln!("SKIP {name}: readelf (binutils) unusable: {other:?}");
            None
        }
    }
}

fn needed(dynamic: &str) -> Vec<String> {
    dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.split(']').next()?.to_string()))
        .collect()
}

/// The dynamic build (tenancy-prolog-dynamic, which the static prolog and epilog hand MIG jobs
/// and NSS-module identities to) links GCC's unwinder statically: the loader maps no
/// libgcc_s.so.1 and its CPUID-heavy constructor does not run per job. glibc stays shared: NSS
/// modules such as sssd need it, and so does NVML.
#[test]
fn the_dynamic_build_needs_only_libc() {
    let Some(dynamic) = readelf("tenancy-prolog-dynamic", "-d") else {
        return;
    };
    let needed = needed(&dynamic);
    assert!(
        needed.iter().any(|n| n.starts_with("libc.so")),
        "NEEDED {needed:?}"
    );
    assert!(
        !needed.iter().any(|n| n.starts_with("libgcc_s")),
        "tenancy-prolog-dynamic loads libgcc_s at every start: NEEDED {needed:?}"
    );
}

/// The NVML stand-in links GCC's unwinder in, as the dynamic build does: loading it (the
/// dynamic build does, twice per MIG job) maps no libgcc_s.so.1 and runs no CPU-model
/// constructor, which the real libnvidia-ml.so.1 does not need either.
#[test]
fn the_nvml_stand_in_needs_no_libgcc_s() {
    let Some(dynamic) = readelf("libnvidia_ml.so", "-d") else {
        return;
    };
    let needed = needed(&dynamic);
    assert!(
        !needed.iter().any(|n| n.starts_with("libgcc_s")),
        "libnvidia_ml.so loads libgcc_s: NEEDED {needed:?}"
    );
}

/// The prolog and epilog are static PIEs: no program interpreter, no shared library, and still
/// position-independent (ASLR) with their relocations read-only after start (RELRO).
#[test]
fn the_prolog_and_epilog_are_static_pies() {
    for name in ["tenancy-prolog", "tenancy-epilog"] {
        let (Some(header), Some(segments), Some(dynamic)) = (
            readelf(name, "-h"),
            readelf(name, "-l"),
            readelf(name, "-d"),
        ) else {
            return;
        };
        assert!(
            header
                .lines()
                .any(|l| l.contains("Type:") && l.contains("DYN")),
            "{name} is not position-independent:\n{header}"
        );
        assert!(
            !segments.contains("INTERP"),
            "{name} is dynamically linked (a program interpreter):\n{segments}"
        );
        assert!(
            segments.contains("GNU_RELRO"),
            "{name} has no RELRO segment:\n{segments}"
        );
        assert_eq!(needed(&dynamic), Vec::<String>::new(), "{name}");
    }
}

/// scripts/build-job-path's folder (TENANCY_JOB_PATH_DIR, which scripts/test sets for a second
/// pass over the tests that run the prolog and epilog) says in its file LIBC which libc its
/// prolog and epilog were linked with, and they are: glibc's start files leave an ABI tag note
/// in every program, musl's none.
#[test]
fn the_job_path_folder_holds_the_libc_it_names() {
    let Some(dir) = std::env::var_os("TENANCY_JOB_PATH_DIR") else {
        eprintln!("SKIP: TENANCY_JOB_PATH_DIR not set (scripts/test sets it for its second pass)");
        return;
    };
    let libc = std::fs::read_to_string(std::path::Path::new(&dir).join("LIBC")).unwrap();
    let libc = libc.trim();
    assert!(["musl", "glibc"].contains(&libc), "LIBC says {libc:?}");
    for name in ["tenancy-prolog", "tenancy-epilog"] {
        let Some(notes) = readelf(name, "-n") else {
            return;
        };
        assert_eq!(
            notes.contains("NT_GNU_ABI_TAG"),
            libc == "glibc",
            "{name} in {dir:?} (LIBC: {libc}):\n{notes}"
        );
    }
}
