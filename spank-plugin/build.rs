//! Generates the SPANK bindings from the Slurm headers installed on the build host
//! (package libslurm-dev), so that `plugin_version` and every constant match the Slurm that
//! loads the plugin. Slurm's loader checks major.minor of `plugin_version`: a plugin built
//! against other headers is refused at load, which is why the headers must be the node's.
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
    let header = include.join("slurm/spank.h");
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
                // spank.h uses uint32_t etc. without including <stdint.h> itself.
                .header_contents(
                    "wrapper.h",
                    "#include <stdint.h>\n#include <sys/types.h>\n#include <slurm/spank.h>\n",
                )
                .clang_arg(format!("-I{}", inc.display()))
                .allowlist_function("spank_.*")
                .allowlist_function("slurm_(info|error|verbose|debug|debug2|spank_log)")
                .allowlist_type("spank_.*")
                .allowlist_var("SLURM_VERSION_NUMBER|ESPANK_.*|SLURM_SUCCESS")
                .layout_tests(false)
                .generate()
        });
        match generated {
            Ok(Ok(bindings)) => {
                bindings.write_to_file(&out).expect("write bindings.rs");
                return;
            }
            Ok(Err(e)) => println!(
                "cargo:warning=spank-tenancy: bindgen failed on {} ({e}); using the checked-in Slurm 22.05 bindings",
                header.display()
            ),
            Err(_) => println!(
                "cargo:warning=spank-tenancy: libclang not found (install libclang-dev); using the checked-in Slurm 22.05 bindings"
            ),
        }
    } else {
        println!(
            "cargo:warning=spank-tenancy: {} not found (install libslurm-dev); using the checked-in Slurm 22.05 bindings",
            header.display()
        );
    }
    std::fs::copy(&fallback, &out).expect("copy fallback bindings");
}
