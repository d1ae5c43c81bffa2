//! Devices: a tier's extra device classes against the driver's majors, RDMA devices and the
//! device controller (the device layer's own doctor).

use super::{row, DoctorArgs, Row};
use std::path::PathBuf;
use tenancy_config::Config;
use tenancy_devices::doctor::{doctor, DoctorParams, Severity};

/// A tier's extra device classes (`device_classes`) are allowed to every job of the tier on top
/// of its own slice: one on the nvidia-caps major, or a whole NVIDIA major (`c 195:* rw`),
/// opens other jobs' MIG slices or other GPUs. The majors are the driver's, so this is checked
/// on the node, not in the config.
fn extra_device_rows(config: &Config, majors: &tenancy_devices::driver::NvidiaMajors) -> Vec<Row> {
    let mut found = Vec::new();
    for tier in config.tiers.values() {
        for text in &tier.device_classes {
            let Ok(class) = text.parse::<tenancy_devices::DeviceClass>() else {
                continue;
            };
            let char_major = class
                .major
                .filter(|_| class.dev_type == tenancy_devices::DevType::Char);
            let Some(major) = char_major else { continue };
            let Some((name, _)) = majors.all.iter().find(|(_, m)| *m == major) else {
                continue;
            };
            let why = if majors.caps == Some(major) {
                "the MIG capability files: other jobs' slices, and config/monitor"
            } else if class.minor.is_none() {
                "every device of that NVIDIA major"
            } else {
                continue;
            };
            found.push(format!("tier {}: `{text}` ({name}): {why}", tier.name));
        }
    }
    if found.is_empty() {
        return Vec::new();
    }
    vec![row(
        "tier.device_classes",
        Severity::Error,
        format!(
            "extra device classes open NVIDIA devices to every job of their tier: {}",
            found.join("; ")
        ),
        Some(
            "remove them: a job's slice, its GPU, nvidiactl and nvidia-uvm are allowed by the \
             devices layer itself; name single non-MIG devices only"
                .into(),
        ),
    )]
}

/// Device classes, RDMA devices and the device controller.
pub(super) fn device_rows(config: &Config, args: &DoctorArgs, rows: &mut Vec<Row>) {
    if let Ok(majors) = std::fs::read_to_string(&config.node.proc_devices)
        .map_err(|e| e.to_string())
        .and_then(|t| {
            tenancy_devices::driver::NvidiaMajors::parse(&t, &config.node.proc_devices)
                .map_err(|e| e.to_string())
        })
    {
        rows.extend(extra_device_rows(config, &majors));
    }
    let tiers: Vec<(String, Vec<String>)> = config
        .tiers
        .values()
        .map(|t| (t.name.clone(), t.device_classes.clone()))
        .collect();
    for f in tenancy_devices::doctor::rdma_findings(&config.node.rdma_devices, &tiers) {
        rows.push(row(&f.check, f.severity, f.message, f.remedy));
    }
    let cgroup_conf = args.slurm_cgroup_conf.clone().unwrap_or_else(|| {
        std::env::var_os("SLURM_CONF")
            .map(PathBuf::from)
            .and_then(|p| p.parent().map(|d| d.join("cgroup.conf")))
            .unwrap_or_else(|| PathBuf::from("/etc/slurm/cgroup.conf"))
    });
    for f in doctor(&DoctorParams {
        mountinfo: PathBuf::from("/proc/self/mountinfo"),
        slurm_cgroup_conf: cgroup_conf,
        driver: tenancy_devices::DriverPaths {
            proc_devices: config.node.proc_devices.clone(),
            mig_minors: config.node.mig_minors.clone(),
            rdma_devices: config.node.rdma_devices.clone(),
            nvidia_caps: config.node.nvidia_caps_dir.clone(),
        },
        probe_bpf: true,
    }) {
        rows.push(row(&f.check, f.severity, f.message, f.remedy));
    }
}

#[cfg(test)]
mod device_class_tests {
    use super::extra_device_rows;
    use tenancy_test_support::TenancyToml;

    /// A tier's extra class on the nvidia-caps major, or a whole NVIDIA major, is an error on
    /// a node whose driver registers those majors; a single nvidia device or another major is
    /// not.
    #[test]
    fn extra_classes_that_open_nvidia_devices_to_a_tier_are_errors() {
        let parse = |classes: &[&str]| {
            let mut text = TenancyToml::under("t", std::path::Path::new("/"));
            text.tier("wide").device_classes(classes);
            text.tenant("acme").tier("wide").groups(["root"]);
            tenancy_config::Config::parse(&text.to_string(), std::path::Path::new("/t.toml"))
                .unwrap()
        };
        let all = ["c 235:* rw", "c 195:* r", "c 195:254 r", "c 1:3 rw"];
        let config = parse(&all);
        let devices = "Character devices:\n  1 mem\n195 nvidia-frontend\n235 nvidia-caps\n";
        let majors = tenancy_devices::driver::NvidiaMajors::parse(
            devices,
            std::path::Path::new("/proc/devices"),
        )
        .unwrap();
        let rows = extra_device_rows(&config, &majors);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].severity, "error");
        let m = &rows[0].message;
        assert!(m.contains("`c 235:* rw` (nvidia-caps)"), "{m}");
        assert!(m.contains("`c 195:* r` (nvidia-frontend)"), "{m}");
        assert!(!m.contains("195:254") && !m.contains("c 1:3"), "{m}");
        // Without the two classes on NVIDIA majors.
        assert!(extra_device_rows(&parse(&all[2..]), &majors).is_empty());
    }
}
