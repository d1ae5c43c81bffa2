//! Generates the job_submit bindings (`job_desc_msg_t`, the version, the error codes) from the
//! Slurm headers in SLURM_INCLUDE_DIR (default: the build host's; build-support/slurm_bindings.rs):
//! slurmctld loads a job_submit plugin only when its `plugin_version` equals its own
//! SLURM_VERSION_NUMBER (micro release included), and the layout of `job_desc_msg_t` changes
//! between releases.

include!("../../build-support/slurm_bindings.rs");

fn main() {
    slurm_bindings(
        "job-submit-tenancy",
        "slurm/slurm.h",
        "#include <slurm/slurm.h>\n#include <slurm/slurm_errno.h>\n",
        |b| {
            b.allowlist_type("job_desc_msg_t")
                .allowlist_var("SLURM_VERSION_NUMBER|SLURM_SUCCESS|SLURM_ERROR")
                .allowlist_type("slurm_err_t")
                .constified_enum_module("slurm_err_t")
                // Only the fields this plugin reads are used; the structs behind the others are
                // kept opaque so the bindings stay small.
                .opaque_type("slurm_addr_t|bitstr_t|cron_entry_t|list_t|List|xlist")
                .prepend_enum_name(false)
        },
        |version| {
            // What src/lib.rs reads of job_desc_msg_t, in every release.
            let mut uses = vec![
                ("job_descriptor", "user_id"),
                ("job_descriptor", "account"),
                ("job_descriptor", "spank_job_env"),
                ("job_descriptor", "spank_job_env_size"),
                ("job_descriptor", "environment"),
                ("job_descriptor", "env_size"),
                ("job_descriptor", "shared"),
                ("job_descriptor", "tres_per_job"),
                ("job_descriptor", "tres_per_node"),
                ("job_descriptor", "tres_per_socket"),
                ("job_descriptor", "tres_per_task"),
                ("job_descriptor", "req_nodes"),
                ("job_descriptor", "exc_nodes"),
                ("job_descriptor", "mcs_label"),
                ("job_descriptor", "bitflags"),
                ("job_descriptor", "priority"),
                ("job_descriptor", "comment"),
                ("job_descriptor", "time_limit"),
                ("job_descriptor", "time_min"),
                ("job_descriptor", "deadline"),
            ];
            // The job id of an update: its own field up to 25.11, in `step_id` from 26.05
            // (`job_id()` in src/lib.rs, selected by the same version).
            if version >= 0x1a_05_00 {
                uses.extend([("job_descriptor", "step_id"), ("slurm_step_id_t", "job_id")]);
            } else {
                uses.push(("job_descriptor", "job_id"));
            }
            uses
        },
    );
}
