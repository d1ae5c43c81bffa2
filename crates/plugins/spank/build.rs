//! Generates the SPANK bindings from the Slurm headers in SLURM_INCLUDE_DIR (default: the build
//! host's; build-support/slurm_bindings.rs), so that `plugin_version` and every constant match the
//! Slurm that loads the plugin. Slurm's loader checks major.minor of `plugin_version`: a plugin
//! built against other headers is refused at load, which is why the headers must be the node's.

include!("../../build-support/slurm_bindings.rs");

fn main() {
    slurm_bindings(
        "spank-tenancy",
        "slurm/spank.h",
        // spank.h uses uint32_t etc. without including <stdint.h> itself.
        "#include <stdint.h>\n#include <sys/types.h>\n#include <slurm/spank.h>\n",
        |b| {
            b.allowlist_function("spank_.*")
                .allowlist_function("slurm_(info|error|verbose|debug|debug2|spank_log)")
                .allowlist_type("spank_.*")
                .allowlist_var("SLURM_VERSION_NUMBER|ESPANK_.*|SLURM_SUCCESS")
        },
        // The one struct the plugin fills in (its options).
        |_| {
            ["name", "arginfo", "usage", "has_arg", "val", "cb"]
                .into_iter()
                .map(|f| ("spank_option", f))
                .collect()
        },
    );
}
