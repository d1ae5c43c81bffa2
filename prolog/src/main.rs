//! `tenancy-prolog`: Slurm runs it as root on the node before the job (Prolog= in slurm.conf).
//! It takes no arguments; the config is found through SLURM_CONF (see tenancy-config).
fn main() -> std::process::ExitCode {
    tenancy_node::run::prolog()
}
