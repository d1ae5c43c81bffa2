//! `tenancyctl doctor` checks for the devices layer: is this node configured so that the
//! device allowlist really binds every task of a job?

use crate::bpf;
use crate::driver::{DriverInfo, DriverPaths};
use crate::job::{Backend, Target};
use crate::policy::{Access, DevType, DeviceClass, DevicePolicy, SliceRef};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tenancy_cgroup::layout::{CgroupLayout, LayoutKind, MOUNTINFO};

/// Severity of a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Ok,
    Info,
    Warn,
    Error,
}

/// One doctor finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Stable check id, e.g. `cgroup.layout`.
    pub check: String,
    pub severity: Severity,
    pub message: String,
    /// What to do, when something should be done.
    pub remedy: Option<String>,
}

fn f(check: &str, severity: Severity, message: String, remedy: Option<&str>) -> Finding {
    Finding {
        check: check.into(),
        severity,
        message,
        remedy: remedy.map(str::to_string),
    }
}

/// Inputs of the doctor (paths are parameters so tests can use fixtures).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoctorParams {
    pub mountinfo: PathBuf,
    /// Slurm's cgroup.conf.
    pub slurm_cgroup_conf: PathBuf,
    pub driver: DriverPaths,
    /// Try to load a BPF device program (needs root).
    pub probe_bpf: bool,
}

impl Default for DoctorParams {
    fn default() -> Self {
        DoctorParams {
            mountinfo: MOUNTINFO.into(),
            slurm_cgroup_conf: "/etc/slurm/cgroup.conf".into(),
            driver: DriverPaths::default(),
            probe_bpf: true,
        }
    }
}

/// Slurm cgroup.conf values that matter here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmCgroupConf {
    /// `CgroupPlugin` (lower-cased), None = absent (autodetect).
    pub plugin: Option<String>,
    /// `ConstrainDevices` (true for yes), None = absent (Slurm's default: no).
    pub constrain_devices: Option<bool>,
}

impl SlurmCgroupConf {
    /// Parse `Key=Value` lines (keys case-insensitive, `#` comments).
    pub fn parse(text: &str) -> SlurmCgroupConf {
        let mut c = SlurmCgroupConf::default();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            let v = v.trim().to_ascii_lowercase();
            match k.trim().to_ascii_lowercase().as_str() {
                "cgroupplugin" => c.plugin = Some(v),
                "constraindevices" => c.constrain_devices = Some(v == "yes" || v == "true"),
                _ => {}
            }
        }
        c
    }

    /// The cgroup version Slurm will use on `layout` (22.05 autodetect: v1 unless pure v2).
    pub fn effective_version(&self, layout: LayoutKind) -> u8 {
        match self.plugin.as_deref() {
            Some("cgroup/v2") => 2,
            Some("cgroup/v1") => 1,
            _ if layout == LayoutKind::Unified => 2,
            _ => 1,
        }
    }
}

/// Run every check.
pub fn doctor(p: &DoctorParams) -> Vec<Finding> {
    let mut out = Vec::new();
    let layout = match CgroupLayout::detect_from(&p.mountinfo) {
        Ok(l) => l,
        Err(e) => {
            out.push(f("cgroup.layout", Severity::Error, e.to_string(), None));
            return out;
        }
    };
    let show = |x: &Option<PathBuf>| x.as_ref().map_or("-".into(), |p| p.display().to_string());
    out.push(f(
        "cgroup.layout",
        Severity::Info,
        format!(
            "{:?}: v1 devices controller at {}, cgroup2 at {}",
            layout.kind,
            show(&layout.v1_devices),
            show(&layout.v2_root)
        ),
        None,
    ));
    out.push(match &layout.v1_devices {
        Some(d) => f(
            "cgroup.v1_devices",
            Severity::Info,
            format!("v1 devices controller mounted at {}", d.display()),
            None,
        ),
        None => f(
            "cgroup.v1_devices",
            Severity::Info,
            "v1 devices controller not mounted".into(),
            None,
        ),
    });
    let target = Target::owned_for(&layout);
    match &target {
        Ok(Target::Owned { root, backend }) => out.push(f(
            "devices.backend",
            Severity::Ok,
            format!(
                "job cgroups go under {}/tenancy/<tenant>/job_<id> ({})",
                root.display(),
                if *backend == Backend::V2 {
                    "cgroup v2 BPF device program, BPF_F_ALLOW_MULTI"
                } else {
                    "cgroup v1 devices rules"
                }
            ),
            None,
        )),
        Ok(_) => {}
        Err(e) => out.push(f(
            "devices.backend",
            Severity::Error,
            e.to_string(),
            Some("mount cgroup2 (or the v1 devices controller)"),
        )),
    }
    let v2_backend = matches!(
        target,
        Ok(Target::Owned {
            backend: Backend::V2,
            ..
        })
    );
    if p.probe_bpf {
        match crate::v2::probe() {
            Ok(()) => out.push(f(
                "bpf.syscall",
                Severity::Ok,
                "bpf(2) loads a cgroup device program".into(),
                None,
            )),
            Err(e) => out.push(f(
                "bpf.syscall",
                if v2_backend {
                    Severity::Error
                } else {
                    Severity::Warn
                },
                format!("bpf(2) BPF_PROG_LOAD of a cgroup device program failed: {e}"),
                Some(match e.raw_os_error() {
                    Some(libc::ENOSYS) => "kernel needs CONFIG_BPF_SYSCALL and CONFIG_CGROUP_BPF",
                    Some(libc::EPERM) => "run as root (CAP_BPF + CAP_SYS_ADMIN)",
                    _ => "check kernel BPF support",
                }),
            )),
        }
    }
    slurm_checks(p, &layout, &mut out);
    driver_checks(p, &mut out);
    out.push(self_check());
    out
}

fn slurm_checks(p: &DoctorParams, layout: &CgroupLayout, out: &mut Vec<Finding>) {
    let text = match std::fs::read_to_string(&p.slurm_cgroup_conf) {
        Ok(t) => t,
        Err(e) => {
            out.push(f(
                "slurm.cgroup_conf",
                Severity::Info,
                format!(
                    "{}: {e}: Slurm cgroup settings not checked",
                    p.slurm_cgroup_conf.display()
                ),
                None,
            ));
            return;
        }
    };
    let c = SlurmCgroupConf::parse(&text);
    let ver = c.effective_version(layout.kind);
    let cd = c.constrain_devices.unwrap_or(false);
    let msg = format!(
        "{}: CgroupPlugin={} (Slurm uses cgroup v{ver} on this {:?} layout), ConstrainDevices={}",
        p.slurm_cgroup_conf.display(),
        c.plugin.as_deref().unwrap_or("autodetect"),
        layout.kind,
        if cd { "yes" } else { "no" }
    );
    let (sev, extra, remedy): (Severity, &str, Option<&str>) = match (layout.kind, ver, cd) {
        (LayoutKind::Unified, _, true) => (
            Severity::Ok,
            "pure cgroup v2 with Slurm's ConstrainDevices (the supported layout): Slurm's cgroup/v2 plugin keeps its device programs on the job, step and task folders (BPF_F_ALLOW_OVERRIDE, flags 0 at task level) and denies the GRES files a job was not given; the tenancy node program is attached BPF_F_ALLOW_MULTI on slurmstepd's scope, above them, and gives each job its own allowlist (MIG capability and RDMA nodes, which Slurm's program accepts), keyed by Slurm's job folder: an open needs both to allow it, and no process leaves Slurm's cgroup",
            None,
        ),
        (LayoutKind::Unified, _, false) => (
            Severity::Ok,
            "pure cgroup v2 without ConstrainDevices: Slurm constrains no GRES device file; the tenancy node program on slurmstepd's scope (BPF_F_ALLOW_MULTI) is every job's device control, keyed by Slurm's job folder, and no process leaves Slurm's cgroup",
            None,
        ),
        (LayoutKind::Hybrid, 1, _) => (
            Severity::Ok,
            "Slurm uses the v1 hierarchies and puts nothing in cgroup2: the tenancy program on the product's cgroup2 tree applies in addition to Slurm's v1 devices rules (a task is checked by both); Slurm's rules do not cover nvidia-caps, the tenancy program does",
            None,
        ),
        (LayoutKind::Legacy, _, true) => (
            Severity::Warn,
            "cgroup v1 only: a task sits in one devices cgroup; moving it into a product-owned devices cgroup takes it out of Slurm's (losing Slurm's GRES rules)",
            Some("apply the v1 rules to Slurm's job cgroup before steps exist, or keep ConstrainDevices=no"),
        ),
        _ => (Severity::Info, "", None),
    };
    out.push(f(
        "slurm.constrain_devices",
        sev,
        if extra.is_empty() {
            msg
        } else {
            format!("{msg}: {extra}")
        },
        remedy,
    ));
}

fn driver_checks(p: &DoctorParams, out: &mut Vec<Finding>) {
    match DriverInfo::load(&p.driver) {
        Ok(d) => {
            let m = &d.majors;
            if m.all.is_empty() {
                out.push(f(
                    "nvidia.driver",
                    Severity::Info,
                    format!(
                        "no NVIDIA character major in {}: no GPU device to restrict",
                        p.driver.proc_devices.display()
                    ),
                    None,
                ));
            } else {
                let names: Vec<String> = m.all.iter().map(|(n, v)| format!("{n}={v}")).collect();
                out.push(f(
                    "nvidia.driver",
                    if m.nvidia.is_some() && m.uvm.is_some() {
                        Severity::Ok
                    } else {
                        Severity::Warn
                    },
                    format!(
                        "NVIDIA majors: {}; mig-minors: {} access entries",
                        names.join(", "),
                        d.mig.access.len()
                    ),
                    None,
                ));
                if m.caps.is_none() {
                    out.push(f("nvidia.caps", Severity::Warn, "no nvidia-caps major: MIG isolation unavailable (jobs with slices will fail closed)".into(), Some("load a MIG-capable NVIDIA driver")));
                }
            }
        }
        Err(e) => out.push(f(
            "nvidia.driver",
            Severity::Error,
            e.to_string(),
            Some("fix the driver files or pass the right paths"),
        )),
    }
}

/// Check the BPF generator against the reference policy on a sample job.
pub fn self_check() -> Finding {
    let drv = DriverInfo {
        majors: crate::driver::NvidiaMajors {
            nvidia: Some(195),
            uvm: Some(509),
            caps: Some(508),
            all: vec![
                ("nvidia-frontend".into(), 195),
                ("nvidia-caps".into(), 508),
                ("nvidia-uvm".into(), 509),
            ],
        },
        mig: crate::driver::MigMinors {
            config: Some(1),
            monitor: Some(2),
            access: vec![
                crate::driver::CapMinor {
                    gpu: 0,
                    gi: 1,
                    ci: None,
                    minor: 12,
                },
                crate::driver::CapMinor {
                    gpu: 0,
                    gi: 1,
                    ci: Some(0),
                    minor: 13,
                },
            ],
            other: vec![],
        },
        rdma: Vec::new(),
    };
    let res = DevicePolicy::for_job(
        &drv,
        &[SliceRef {
            gpu_minor: 0,
            gi_id: 1,
            ci_id: 0,
        }],
        &[],
    )
    .map_err(|e| e.to_string())
    .and_then(|p| {
        let prog = bpf::generate(&p);
        for ma in [1, 195, 508, 509] {
            for mi in [0, 1, 2, 3, 12, 13, 255] {
                for acc in 1..8u8 {
                    let want = p.decide(DevType::Char, ma, mi, Access(acc))
                        == crate::policy::Verdict::Allow;
                    let got =
                        bpf::interp::run(&prog, (acc as u32) << 16 | bpf::DEVCG_DEV_CHAR, ma, mi)
                            .map_err(|e| e.to_string())?;
                    if (got == 1) != want {
                        return Err(format!("c {ma}:{mi} access {acc}: program says {got}"));
                    }
                }
            }
        }
        Ok(prog.len())
    });
    match res {
        Ok(n) => f(
            "devices.selfcheck",
            Severity::Ok,
            format!("generated device program ({n} insns) agrees with the policy"),
            None,
        ),
        Err(e) => f(
            "devices.selfcheck",
            Severity::Error,
            format!("generator disagrees with the policy: {e}"),
            Some("do not deploy this build"),
        ),
    }
}

/// The node's RDMA devices (`dir`, e.g. /dev/infiniband) and which tiers may open them: a
/// device is opened only through a tier's `device_classes` (the verbs data path bypasses
/// nftables), so the doctor names, per tier, what it lets through (`tiers`: name and classes).
pub fn rdma_findings(dir: &std::path::Path, tiers: &[(String, Vec<String>)]) -> Vec<Finding> {
    let devices = match crate::driver::rdma_devices(dir) {
        Ok(d) => d,
        Err(e) => {
            return vec![f(
                "devices.rdma",
                Severity::Error,
                format!("cannot list RDMA devices: {e}"),
                Some("check node.rdma_devices in tenancy.toml"),
            )]
        }
    };
    if devices.is_empty() {
        return vec![f(
            "devices.rdma",
            Severity::Ok,
            format!("no RDMA device nodes in {}", dir.display()),
            None,
        )];
    }
    let names = |ds: &[&crate::driver::RdmaDevice]| {
        ds.iter()
            .map(|d| format!("{} ({}:{})", d.path.display(), d.major, d.minor))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = vec![f(
        "devices.rdma",
        Severity::Info,
        format!(
            "RDMA devices on this node, denied to jobs unless their tier lists them in \
             device_classes (their traffic bypasses the firewall): {}",
            names(&devices.iter().collect::<Vec<_>>())
        ),
        None,
    )];
    for (tier, classes) in tiers {
        let classes: Vec<DeviceClass> = classes.iter().filter_map(|c| c.parse().ok()).collect();
        let open: Vec<&crate::driver::RdmaDevice> = devices
            .iter()
            .filter(|d| {
                classes
                    .iter()
                    .any(|c| c.matches(DevType::Char, d.major, d.minor, Access::READ))
            })
            .collect();
        let message = if open.is_empty() {
            format!("tier {tier} may open no RDMA device")
        } else {
            format!("tier {tier} may open {}", names(&open))
        };
        out.push(f(
            "devices.rdma",
            if open.is_empty() {
                Severity::Ok
            } else {
                Severity::Info
            },
            message,
            None,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn run(mountinfo: &str, cgconf: Option<&str>) -> Vec<Finding> {
        let dir = tempfile::tempdir().unwrap();
        let mi = dir.path().join("mountinfo");
        std::fs::File::create(&mi)
            .unwrap()
            .write_all(mountinfo.as_bytes())
            .unwrap();
        let cc = dir.path().join("cgroup.conf");
        if let Some(c) = cgconf {
            std::fs::write(&cc, c).unwrap();
        }
        std::fs::write(
            dir.path().join("devices"),
            "Character devices:\n195 nvidia\n508 nvidia-caps\n509 nvidia-uvm\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("mig"), "config 1\nmonitor 2\n").unwrap();
        doctor(&DoctorParams {
            mountinfo: mi,
            slurm_cgroup_conf: cc,
            driver: DriverPaths {
                proc_devices: dir.path().join("devices"),
                mig_minors: dir.path().join("mig"),
                rdma_devices: dir.path().join("infiniband"),
                nvidia_caps: dir.path().join("nvidia-caps"),
            },
            probe_bpf: false,
        })
    }

    fn sev(v: &[Finding], check: &str) -> Severity {
        v.iter()
            .find(|x| x.check == check)
            .unwrap_or_else(|| panic!("{check} in {v:?}"))
            .severity
    }

    const PURE: &str = "30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    const HYBRID: &str = "35 30 0:31 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n40 30 0:36 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";

    /// Pure cgroup v2 with Slurm's ConstrainDevices is the supported layout (the isolation
    /// anchored in Slurm's job folder): no error, and without it neither.
    #[test]
    fn pure_v2_with_or_without_constrain_devices_is_supported() {
        let v = run(
            PURE,
            Some("CgroupPlugin=autodetect\nConstrainDevices=yes # gpus\n"),
        );
        assert_eq!(sev(&v, "slurm.constrain_devices"), Severity::Ok);
        let v = run(PURE, Some("ConstrainDevices=no\n"));
        assert_eq!(sev(&v, "slurm.constrain_devices"), Severity::Ok);
    }

    #[test]
    fn hybrid_is_ok() {
        let v = run(
            HYBRID,
            Some("CgroupPlugin=autodetect\nConstrainDevices=yes\n"),
        );
        assert_eq!(sev(&v, "slurm.constrain_devices"), Severity::Ok);
        assert_eq!(sev(&v, "devices.backend"), Severity::Ok);
        assert_eq!(sev(&v, "nvidia.driver"), Severity::Ok);
        assert_eq!(sev(&v, "devices.selfcheck"), Severity::Ok);
        let v = run(HYBRID, None);
        assert_eq!(sev(&v, "slurm.cgroup_conf"), Severity::Info);
    }

    #[test]
    fn no_cgroups_is_an_error() {
        let v = run("", None);
        assert_eq!(sev(&v, "devices.backend"), Severity::Error);
    }

    #[test]
    fn conf_parse() {
        let c = SlurmCgroupConf::parse(
            "cgroupplugin = cgroup/v2\n#ConstrainDevices=yes\nCONSTRAINDEVICES=Yes\n",
        );
        assert_eq!(c.plugin.as_deref(), Some("cgroup/v2"));
        assert_eq!(c.constrain_devices, Some(true));
        assert_eq!(c.effective_version(LayoutKind::Hybrid), 2);
        assert_eq!(
            SlurmCgroupConf::default().effective_version(LayoutKind::Hybrid),
            1
        );
        assert_eq!(
            SlurmCgroupConf::default().effective_version(LayoutKind::Unified),
            2
        );
    }
}
