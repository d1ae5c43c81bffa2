//! `tenancy-epilog`: Slurm runs it as root on the node after the job (Epilog= in slurm.conf).
//! It takes no arguments; the config is found through SLURM_CONF (see tenancy-config).
fn main() -> std::process::ExitCode {
    tenancy_node::run::epilog()
}
