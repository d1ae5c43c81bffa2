//! The device policy of one job: which NVIDIA device nodes it may open.
//!
//! Semantics (the reference that the v1 rules and the v2 BPF program both implement):
//! 1. if an `allow` rule matches the device and grants every requested access bit: allow;
//! 2. else if the device is a character device of a major in `deny_majors`, or one of
//!    `deny_devices` (the node's RDMA devices: their traffic bypasses the firewall): deny;
//! 3. else: allow (devices of other majors are not this layer's business).

use crate::driver::{
    DriverInfo, NVIDIACTL_MINOR, NVIDIA_MODESET_MINOR, UVM_MINOR, UVM_TOOLS_MINOR,
};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// Device classes are config values (a tier's `device_classes`): the types are the config's.
pub use tenancy_config::device_class::{Access, DevType, DeviceClass};

/// A job's MIG slice: the parent GPU's minor (/dev/nvidia<minor>, `gpu<minor>` in mig-minors),
/// its GPU instance id and compute instance id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceRef {
    pub gpu_minor: u32,
    pub gi_id: u32,
    pub ci_id: u32,
}

/// One allowed device class with the reason it is allowed (journal/audit readable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowRule {
    pub class: DeviceClass,
    pub why: String,
}

/// Verdict for one access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    Allow,
    Deny,
}

/// The device policy of one job. Serializable into the job journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicePolicy {
    /// Allowed classes (first step of the decision).
    pub allow: Vec<AllowRule>,
    /// Character majors of which everything not allowed is denied (all NVIDIA majors).
    pub deny_majors: Vec<u32>,
    /// Single character devices denied unless allowed: the node's RDMA devices (`uverbs*`,
    /// `rdma_cm`, ...), which a tier opens by listing them in `device_classes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_devices: Vec<DeviceClass>,
}

impl DevicePolicy {
    /// Build the policy of a job from the driver info, its MIG slices and the extra classes
    /// its tier allows. Fails closed: a slice missing from mig-minors, or a driver without the
    /// majors a slice needs, is an error; an extra class that would open every NVIDIA device
    /// (`c *:*`) is refused.
    pub fn for_job(drv: &DriverInfo, slices: &[SliceRef], extra: &[DeviceClass]) -> Result<Self> {
        let mut allow = Allows::default();
        if !slices.is_empty() {
            let need = |m: Option<u32>, name: &str| {
                m.ok_or_else(|| {
                    Error::Policy(format!(
                        "job has MIG slice(s) {slices:?} but the driver registers no `{name}` character major: is the NVIDIA driver (with MIG) loaded?"
                    ))
                })
            };
            let nv = need(drv.majors.nvidia, "nvidia-frontend/nvidia")?;
            let caps = need(drv.majors.caps, "nvidia-caps")?;
            allow.control_devices(drv, nv);
            for s in slices {
                allow.slice(drv, nv, caps, s)?;
            }
        }
        for x in extra {
            if let Some(why) = x.refusal_as_extra() {
                return Err(Error::Policy(why));
            }
            allow.push(*x, "extra (tier config)".into());
        }
        Ok(DevicePolicy {
            allow: allow.0,
            deny_majors: deny_majors(drv),
            deny_devices: rdma_devices(drv),
        })
    }

    /// Whether `major:minor` is one of [`DevicePolicy::deny_devices`].
    fn denied_device(&self, major: u32, minor: u32) -> bool {
        self.deny_devices
            .iter()
            .any(|d| d.major == Some(major) && d.minor == Some(minor))
    }

    /// The reference decision (see module docs).
    pub fn decide(&self, t: DevType, major: u32, minor: u32, access: Access) -> Verdict {
        if self
            .allow
            .iter()
            .any(|r| r.class.matches(t, major, minor, access))
        {
            return Verdict::Allow;
        }
        if t == DevType::Char
            && (self.deny_majors.contains(&major) || self.denied_device(major, minor))
        {
            return Verdict::Deny;
        }
        Verdict::Allow
    }

    /// Allow rules that can change a verdict (on a denied major); the others are implied by
    /// the default allow.
    pub fn effective_allows(&self) -> impl Iterator<Item = &DeviceClass> {
        self.allow.iter().map(|r| &r.class).filter(|c| {
            c.dev_type == DevType::Char
                && c.major.is_some_and(|m| {
                    self.deny_majors.contains(&m)
                        || self.deny_devices.iter().any(|d| d.major == Some(m))
                })
        })
    }
}

/// Every NVIDIA character major the driver registers, sorted.
fn deny_majors(drv: &DriverInfo) -> Vec<u32> {
    let mut deny_majors: Vec<u32> = drv.majors.all.iter().map(|(_, m)| *m).collect();
    for m in [drv.majors.nvidia, drv.majors.uvm, drv.majors.caps]
        .into_iter()
        .flatten()
    {
        if !deny_majors.contains(&m) {
            deny_majors.push(m);
        }
    }
    deny_majors.sort_unstable();
    deny_majors
}

/// The node's RDMA devices, sorted, each once.
fn rdma_devices(drv: &DriverInfo) -> Vec<DeviceClass> {
    let mut deny_devices: Vec<DeviceClass> = drv
        .rdma
        .iter()
        .map(|d| DeviceClass::char(d.major, d.minor, Access::RWM))
        .collect();
    deny_devices.sort_by_key(|d| (d.major, d.minor));
    deny_devices.dedup();
    deny_devices
}

/// A job's allow rules in the order they were added, each class once (its first reason).
#[derive(Default)]
struct Allows(Vec<AllowRule>);

impl Allows {
    fn push(&mut self, class: DeviceClass, why: String) {
        if !self.0.iter().any(|r| r.class == class) {
            self.0.push(AllowRule { class, why });
        }
    }

    /// What every CUDA process of a MIG job opens: nvidiactl, and nvidia-uvm once registered.
    fn control_devices(&mut self, drv: &DriverInfo, nv: u32) {
        self.push(
            DeviceClass::char(nv, NVIDIACTL_MINOR, Access::RW),
            "nvidiactl".into(),
        );
        // nvidia-uvm is loaded on first use on some nodes: not registered yet, it is in no
        // deny list either, so the job reaches it once it is (it separates no tenants).
        if let Some(uvm) = drv.majors.uvm {
            self.push(
                DeviceClass::char(uvm, UVM_MINOR, Access::RW),
                "nvidia-uvm".into(),
            );
            self.push(
                DeviceClass::char(uvm, UVM_TOOLS_MINOR, Access::RW),
                "nvidia-uvm-tools".into(),
            );
        }
    }

    /// One MIG slice: its parent GPU and the access capabilities of its GI and CI, whose
    /// minors mig-minors must name (and not as the config/monitor capabilities).
    fn slice(&mut self, drv: &DriverInfo, nv: u32, caps: u32, s: &SliceRef) -> Result<()> {
        if s.gpu_minor >= NVIDIA_MODESET_MINOR {
            return Err(Error::Policy(format!(
                "slice {s:?}: GPU minor {} is not a GPU (254 is nvidia-modeset, 255 nvidiactl)",
                s.gpu_minor
            )));
        }
        self.push(
            DeviceClass::char(nv, s.gpu_minor, Access::RW),
            format!("/dev/nvidia{} (parent GPU)", s.gpu_minor),
        );
        let gi = drv.mig.lookup(s.gpu_minor, s.gi_id, None).ok_or_else(|| {
            Error::Policy(format!(
                "slice {s:?}: no gpu{}/gi{}/access in mig-minors: is MIG enabled and the GPU instance created?",
                s.gpu_minor, s.gi_id
            ))
        })?;
        let ci = drv
            .mig
            .lookup(s.gpu_minor, s.gi_id, Some(s.ci_id))
            .ok_or_else(|| {
                Error::Policy(format!(
                    "slice {s:?}: no gpu{}/gi{}/ci{}/access in mig-minors",
                    s.gpu_minor, s.gi_id, s.ci_id
                ))
            })?;
        for (minor, what) in [(gi, "GI"), (ci, "CI")] {
            if Some(minor) == drv.mig.config || Some(minor) == drv.mig.monitor {
                return Err(Error::Policy(format!(
                    "slice {s:?}: {what} access minor {minor} equals the config/monitor capability minor: corrupt mig-minors"
                )));
            }
        }
        self.push(
            DeviceClass::char(caps, gi, Access::RW),
            format!("gpu{}/gi{}/access", s.gpu_minor, s.gi_id),
        );
        self.push(
            DeviceClass::char(caps, ci, Access::RW),
            format!("gpu{}/gi{}/ci{}/access", s.gpu_minor, s.gi_id, s.ci_id),
        );
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::driver::{DriverPaths, MigMinors, NvidiaMajors};
    use std::path::Path;

    pub(crate) fn driver() -> DriverInfo {
        let devs = "Character devices:\n  1 mem\n136 pts\n195 nvidia-frontend\n234 nvidia-nvswitch\n235 nvidia-caps\n237 nvidia-uvm\n";
        let mig = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\ngpu1/gi1/access 147\ngpu1/gi1/ci0/access 148\n";
        DriverInfo {
            majors: NvidiaMajors::parse(devs, Path::new("d")).unwrap(),
            mig: MigMinors::parse(mig, Path::new("m"), None).unwrap(),
            rdma: Vec::new(),
        }
    }

    pub(crate) fn job_a() -> DevicePolicy {
        DevicePolicy::for_job(
            &driver(),
            &[SliceRef {
                gpu_minor: 0,
                gi_id: 1,
                ci_id: 0,
            }],
            &["c 1:* rwm".parse().unwrap(), "c 195:254 r".parse().unwrap()],
        )
        .unwrap()
    }

    /// A node that loads nvidia-uvm on first use registers no uvm major yet: a job with a
    /// slice still gets its slice (not a failed prolog and a drained node).
    #[test]
    fn a_driver_without_uvm_yet_still_gives_a_job_its_slice() {
        let devs = "Character devices:\n195 nvidia-frontend\n235 nvidia-caps\n";
        let drv = DriverInfo {
            majors: NvidiaMajors::parse(devs, Path::new("d")).unwrap(),
            ..driver()
        };
        assert_eq!(drv.majors.uvm, None);
        let slice = SliceRef {
            gpu_minor: 0,
            gi_id: 1,
            ci_id: 0,
        };
        let p = DevicePolicy::for_job(&drv, &[slice], &[]).unwrap();
        let whys: Vec<&str> = p.allow.iter().map(|r| r.why.as_str()).collect();
        assert!(whys.contains(&"nvidiactl"), "{whys:?}");
        assert!(whys.iter().any(|w| w.ends_with("/access")), "{whys:?}");
        assert!(!whys.iter().any(|w| w.contains("uvm")), "{whys:?}");
        assert!(!p.deny_majors.contains(&237));
    }

    #[test]
    fn class_roundtrip() {
        for s in ["c 1:* rwm", "b *:* r", "c 195:254 rw", "c 4095:1048575 m"] {
            let c: DeviceClass = s.parse().unwrap();
            assert_eq!(c.to_string(), s);
            let j = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<DeviceClass>(&j).unwrap(), c);
        }
        for s in [
            "a *:* rwm",
            "c 1:* ",
            "c 1 rwm",
            "c 1:x r",
            "c 4096:0 r",
            "c 1:1 rr",
            "c 1:1 q",
            "x 1:1 r",
            "c -1:1 r",
            "c 1:1 r extra",
        ] {
            assert!(s.parse::<DeviceClass>().is_err(), "{s}");
        }
    }

    #[test]
    fn table() {
        use DevType::*;
        use Verdict::*;
        let p = job_a();
        let rw = Access::RW;
        let table: &[(DevType, u32, u32, Access, Verdict)] = &[
            (Char, 195, 255, rw, Allow),           // nvidiactl
            (Char, 195, 255, Access::RWM, Deny),   // no mknod
            (Char, 195, 0, rw, Allow),             // own GPU
            (Char, 195, 1, rw, Deny),              // other GPU
            (Char, 195, 254, Access::READ, Allow), // extra r
            (Char, 195, 254, rw, Deny),
            (Char, 237, 0, rw, Allow),
            (Char, 237, 1, rw, Allow),
            (Char, 237, 2, rw, Deny),
            (Char, 235, 12, rw, Allow), // own GI
            (Char, 235, 13, rw, Allow), // own CI
            (Char, 235, 21, rw, Deny),  // job B GI
            (Char, 235, 22, rw, Deny),
            (Char, 235, 1, Access::READ, Deny), // config
            (Char, 235, 2, Access::READ, Deny), // monitor
            (Char, 235, 147, rw, Deny),         // other GPU's cap
            (Char, 234, 0, rw, Deny),           // nvswitch
            (Char, 1, 3, Access::RWM, Allow),   // /dev/null
            (Char, 136, 4, rw, Allow),          // pty
            (Char, 5, 2, rw, Allow),
            (Block, 195, 0, rw, Allow), // block major 195 is not the nvidia char major
            (Block, 8, 0, Access::RWM, Allow),
        ];
        for &(t, ma, mi, acc, v) in table {
            assert_eq!(p.decide(t, ma, mi, acc), v, "{t:?} {ma}:{mi} {acc}");
        }
    }

    #[test]
    fn no_slice_denies_all_nvidia() {
        let p = DevicePolicy::for_job(&driver(), &[], &[]).unwrap();
        assert!(p.allow.is_empty());
        assert_eq!(p.deny_majors, vec![195, 234, 235, 237]);
        for (ma, mi) in [(195, 255), (195, 0), (237, 0), (235, 12)] {
            assert_eq!(p.decide(DevType::Char, ma, mi, Access::READ), Verdict::Deny);
        }
    }

    #[test]
    fn fails_closed() {
        let d = driver();
        let s = |g, gi, ci| SliceRef {
            gpu_minor: g,
            gi_id: gi,
            ci_id: ci,
        };
        assert!(DevicePolicy::for_job(&d, &[s(0, 9, 0)], &[]).is_err());
        assert!(DevicePolicy::for_job(&d, &[s(0, 1, 5)], &[]).is_err());
        assert!(DevicePolicy::for_job(&d, &[s(255, 1, 0)], &[]).is_err());
        assert!(DevicePolicy::for_job(&d, &[], &["c *:* rwm".parse().unwrap()]).is_err());
        let mut nodrv = d.clone();
        nodrv.majors.caps = None;
        let e = DevicePolicy::for_job(&nodrv, &[s(0, 1, 0)], &[]).unwrap_err();
        assert!(e.to_string().contains("nvidia-caps"), "{e}");
        let _ = DriverPaths::default();
    }

    #[test]
    fn serde_roundtrip() {
        let p = job_a();
        let j = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<DevicePolicy>(&j).unwrap(), p);
    }
}
