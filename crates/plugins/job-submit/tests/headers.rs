//! The build's check of the Slurm headers (build-support/slurm_headers.rs): the release comes
//! from the headers' SLURM_VERSION_NUMBER, and bindings that lack a field the plugin reads fail
//! the build with a message naming the struct, the field and the release.

#![allow(dead_code)]
include!("../../../build-support/slurm_headers.rs");

/// The bindings this build generated (from SLURM_INCLUDE_DIR, default /usr/include).
const BINDINGS: &str = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));

#[test]
fn the_version_comes_from_slurm_version_h() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("slurm")).unwrap();
    let h = dir.path().join("slurm/slurm_version.h");
    std::fs::write(
        &h,
        "#ifndef X\n#define SLURM_VERSION_NUMBER 0x1a0505\n#endif\n",
    )
    .unwrap();
    assert_eq!(slurm_version_number(dir.path()), Ok(0x1a0505));
    assert_eq!(slurm_version_text(0x1a0505), "26.05.5");
    assert_eq!(slurm_version_text(0x180b05), "24.11.5");
    std::fs::write(&h, "/* nothing */\n").unwrap();
    let e = slurm_version_number(dir.path()).unwrap_err();
    assert!(e.contains("defines no SLURM_VERSION_NUMBER"), "{e}");
    // The plugin carries the version of the headers it was built against.
    let include = option_env!("SLURM_INCLUDE_DIR").unwrap_or("/usr/include");
    assert_eq!(
        slurm_version_number(std::path::Path::new(include)),
        Ok(job_submit_tenancy::SLURM_VERSION_NUMBER)
    );
}

#[test]
fn a_field_the_plugin_reads_missing_from_the_headers_fails_the_build() {
    let uses = [
        ("job_descriptor", "user_id"),
        ("job_descriptor", "spank_job_env"),
    ];
    assert_eq!(
        check_fields(BINDINGS, 0x180b05, "job-submit-tenancy", &uses),
        Ok(())
    );
    // The same bindings without `spank_job_env`, as a release that renamed it would give.
    let without: String = BINDINGS
        .lines()
        .filter(|l| !l.trim_start().starts_with("pub spank_job_env:"))
        .map(|l| format!("{l}\n"))
        .collect();
    let e = check_fields(&without, 0x1a0505, "job-submit-tenancy", &uses).unwrap_err();
    assert!(
        e.contains("Slurm 26.05.5")
            && e.contains("struct job_descriptor has no field `spank_job_env`")
            && e.contains("job-submit-tenancy"),
        "{e}"
    );
    let e = check_fields(BINDINGS, 0x1a0505, "x", &[("no_such_t", "f")]).unwrap_err();
    assert!(e.contains("struct no_such_t is missing"), "{e}");
}
