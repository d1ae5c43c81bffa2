//! Adapters that plug each isolation mechanism (crates under `layers/`) into the spine, in the
//! order a job's isolation is built: MIG slice, job cgroup, device allowlist, scratch, network.

use crate::layer::Layer;
use tenancy_config::Config;

/// The layers of a node, in job-start order.
pub fn for_node(config: &Config) -> Vec<Box<dyn Layer>> {
    let _ = config;
    Vec::new()
}
