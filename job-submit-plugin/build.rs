//! Generates the job_submit bindings (`job_desc_msg_t`, the version, the error codes) from the
//! Slurm headers installed on the build host (package libslurm-dev): slurmctld loads a
//! job_submit plugin only when its `plugin_version` equals its own SLURM_VERSION_NUMBER, and the
//! layout of `job_desc_msg_t` changes between releases, so both must come from the headers of
//! the Slurm that loads it.
//!
//! Without libclang (package libclang-dev) or without the headers, the checked-in bindings
//! generated from Slurm 22.05 headers are used and a warning says so.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");
    println!("cargo:rerun-if-changed=src/sys_22_05.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("bindings.rs");
    let include =
        PathBuf::from(std::env::var("SLURM_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".into()));
    let header = include.join("slurm/slurm.h");
    let fallback = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"))
        .join("src/sys_22_05.rs");

    if header.is_file() {
        println!("cargo:rerun-if-changed={}", header.display());
        println!(
            "cargo:rerun-if-changed={}",
            include.join("slurm/slurm_version.h").display()
        );
        let inc = include.clone();
        // bindgen panics when libclang cannot be loaded: fall back instead of failing the build.
        let generated = std::panic::catch_unwind(move || {
            bindgen::Builder::default()
                .header_contents(
                    "wrapper.h",
                    "#include <slurm/slurm.h>\n#include <slurm/slurm_errno.h>\n",
                )
                .clang_arg(format!("-I{}", inc.display()))
                .allowlist_type("job_desc_msg_t")
                .allowlist_var("SLURM_VERSION_NUMBER|SLURM_SUCCESS|SLURM_ERROR")
                .allowlist_type("slurm_err_t")
                .constified_enum_module("slurm_err_t")
                // Only the fields this plugin reads are used; the structs behind the others are
                // kept opaque so the bindings stay small.
                .opaque_type("slurm_addr_t|bitstr_t|cron_entry_t|list_t|List|xlist")
                .prepend_enum_name(false)
                .layout_tests(false)
                .generate()
        });
        match generated {
            Ok(Ok(bindings)) => {
                bindings.write_to_file(&out).expect("write bindings.rs");
                return;
            }
            Ok(Err(e)) => println!(
                "cargo:warning=job-submit-tenancy: bindgen failed on {} ({e}); using the checked-in Slurm 22.05 bindings",
                header.display()
            ),
            Err(_) => println!(
                "cargo:warning=job-submit-tenancy: libclang not found (install libclang-dev); using the checked-in Slurm 22.05 bindings"
            ),
        }
    } else {
        println!(
            "cargo:warning=job-submit-tenancy: {} not found (install libslurm-dev); using the checked-in Slurm 22.05 bindings",
            header.display()
        );
    }
    std::fs::copy(&fallback, &out).expect("copy fallback bindings");
}
