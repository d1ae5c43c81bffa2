//! Adapters that plug each isolation mechanism (crates under `layers/`) into the spine, in the
//! order a job's isolation is built: MIG slice, device allowlist (creates the job cgroup),
//! network (keys on that cgroup), scratch, and the DCGM job mapping (names the MIG instance).

pub mod dcgm;
mod devices;
pub mod mig;
pub mod network;
mod scratch;

use crate::layer::Layer;
use tenancy_config::Config;
use tenancy_mig::NodePlan;

/// The layers of a node, in job-start order.
pub fn for_node(config: &Config) -> Vec<Box<dyn Layer + '_>> {
    if let Some(fixture) = &config.cluster.nvml_shim_fixture {
        // Only the NVML stand-in reads this; slurmd gives the prolog no environment to carry it.
        std::env::set_var("NVML_SHIM_FIXTURE", fixture);
    }
    vec![
        Box::new(mig::MigLayer {
            library: config.cluster.nvml_library.clone(),
            plan: NodePlan {
                models: config.mig_plan.clone(),
                gpus: Default::default(),
            },
            nvml: None,
            state_dir: config.cluster.state_dir.clone(),
            timeout: std::time::Duration::from_millis(config.node.nvml_timeout_ms),
            driver: tenancy_devices::DriverPaths {
                proc_devices: config.node.proc_devices.clone(),
                mig_minors: config.node.mig_minors.clone(),
                rdma_devices: config.node.rdma_devices.clone(),
                nvidia_caps: config.node.nvidia_caps_dir.clone(),
            },
            in_use_retries: 0,
        }),
        Box::new(devices::Devices {
            driver: tenancy_devices::DriverPaths {
                proc_devices: config.node.proc_devices.clone(),
                mig_minors: config.node.mig_minors.clone(),
                rdma_devices: config.node.rdma_devices.clone(),
                nvidia_caps: config.node.nvidia_caps_dir.clone(),
            },
            target: None,
            programs_file: Some(config.cluster.state_dir.join("device-programs")),
        }),
        Box::new(network::Network { spec: None, config }),
        Box::new(scratch::Scratch::new(config)),
        Box::new(dcgm::DcgmMapping {
            dir: config.cluster.dcgm_job_mapping_dir.clone(),
        }),
    ]
}

/// The subfolders of `dir` (name, path), sorted; none when it cannot be read.
fn subdirs(dir: &std::path::Path) -> Vec<(String, std::path::PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<(String, std::path::PathBuf)> = rd
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    v.sort();
    v
}

/// The job of a folder named `job_<id>`.
fn job_id_of(name: &str) -> Option<u64> {
    name.strip_prefix("job_")?.parse().ok()
}
